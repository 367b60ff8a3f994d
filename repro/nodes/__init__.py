"""The machines: SSH transport, the facts each node reports, and preflight's checks of them."""
