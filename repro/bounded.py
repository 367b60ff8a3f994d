"""HTTP answers read whole within a deadline and a size cap: the package index's and the registries'.

A server that trickles its answer, or sends one without end, costs at most the deadline: the reading runs
in a thread of its own that is waited for no longer than that, and stops by itself at the first read past
it or past the cap. Every such failure is an OSError saying which bound was met.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes


def fetch(req: urllib.request.Request, *, deadline_s: float, max_bytes: int,
          opener: urllib.request.OpenerDirector | None = None) -> Answer:
    """The answer to ``req``, read whole within ``deadline_s`` seconds and ``max_bytes`` bytes (else OSError;
    an HTTP error status is urllib's HTTPError, which is one too)."""
    deadline = time.monotonic() + deadline_s
    got: list[Any] = []

    def read() -> None:
        try:
            got.append(_read(req, deadline, deadline_s, max_bytes, opener))
        except BaseException as e:  # handed to the caller's thread
            got.append(e)

    reader = threading.Thread(target=read, name="repro-http", daemon=True)
    reader.start()
    reader.join(deadline_s)
    if not got:
        raise OSError(f"no whole answer within {deadline_s:g} s")
    if isinstance(got[0], BaseException):
        raise got[0]
    return got[0]


def _read(req: urllib.request.Request, deadline: float, deadline_s: float, max_bytes: int,
          opener: urllib.request.OpenerDirector | None) -> Answer:
    chunks, size = [], 0
    try:
        with (opener.open if opener else urllib.request.urlopen)(req, timeout=deadline_s) as r:
            while chunk := r.read(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise OSError(f"an answer over {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise OSError(f"no whole answer within {deadline_s:g} s")
                chunks.append(chunk)
            if getattr(r, "length", None):  # fewer bytes than its Content-Length said
                raise OSError(f"an answer cut short ({r.length} of its bytes missing)")
            return Answer(r.status, r.headers, b"".join(chunks))
    except http.client.HTTPException as e:  # a broken answer (cut short, bad status line)
        raise OSError(f"a broken HTTP answer: {type(e).__name__}") from None
