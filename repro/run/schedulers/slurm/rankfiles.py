"""A rank's files, written by the rank itself in its container before its command runs: pyxis and Apptainer
make the container from the image and copy nothing into it (the tf-ps launcher's pair runner). Each file's
text goes as base64 (an argv word with no line break or quote, as a ``--multi-prog`` line needs)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

#: argv: TEXT PATH COMMAND...: the file written, then the command run in its place (its exit status)
WRITE_FILE = 'printf %s "$1" | base64 -d > "$2" || exit 127; shift 2; exec "$@"'


def files_first(argv: Sequence[str], files: Mapping[str, str]) -> list[str]:
    """``argv`` after each of ``files`` (path: text) is written, in path order."""
    out = list(argv)
    for path, text in sorted(files.items(), reverse=True):
        out = ["sh", "-c", WRITE_FILE, "sh", base64.b64encode(text.encode()).decode(), path, *out]
    return out
