"""What a run leaves behind: the provenance record, the sealed archive, audit and diff."""
