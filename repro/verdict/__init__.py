"""Published beside reproduced: re-derivation and new-run verdicts, their rules, and the reports."""
