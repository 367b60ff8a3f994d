"""Numbers from logs: the parsers, the measurement protocol, the user's log trees, NCCL's transport."""
