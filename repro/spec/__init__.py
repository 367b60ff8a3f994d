"""What a reproduction is: the manifest and its schema, the hosts inventory and its scheduler settings,
datasets."""
