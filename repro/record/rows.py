"""What each column of the results store may hold: a store may have been tampered with, so every row read
is checked (repro.record.store.checked_row) before a verb uses it."""

from __future__ import annotations

import json
from typing import Any

#: what each column may hold: "text", "int", "real", "json" (a JSON list of numbers), "json{}" (a JSON
#: object); "?" after it: or null
KINDS = {"id": "int", "run_no": "int", "run": "int", "digest": "text", "kind": "text", "run_id": "text?",
         "source": "text", "started": "text", "recorded": "text", "cluster": "text?", "kit_version": "text?",
         "facts": "json{}", "tbl": "text", "target": "text", "cell": "text", "framework": "text?",
         "device": "text?", "nodes": "int?", "gpus": "int?", "precision": "text?", "batch_size": "int?",
         "unit": "text?", "published": "text?", "value": "real?", "low": "real?", "high": "real?",
         "repeats": "json", "n": "int", "spread_pct": "real?", "delta_pct": "real?", "verdict": "text",
         "reason": "text?", "tolerance_pct": "real?", "tolerance_reason": "text?", "telemetry": "json{}?"}
_TYPES = {"text": (str,), "int": (int,), "real": (int, float)}


def holds(kind: str, v: Any) -> Any:
    """``v`` as a column of ``kind`` holds it (JSON decoded), or ValueError where it is of another type."""
    if v is None and kind.endswith("?"):
        return None
    kind = kind.rstrip("?")
    if kind.startswith("json"):
        try:
            doc = json.loads(v) if isinstance(v, str) else None
        except (ValueError, RecursionError):
            doc = None
        if kind == "json{}" and isinstance(doc, dict):
            return doc
        if kind == "json" and isinstance(doc, list) and all(type(x) in (int, float) for x in doc):
            return doc
        raise ValueError("JSON " + ("object" if kind == "json{}" else "list of numbers"))
    if type(v) not in _TYPES[kind]:
        raise ValueError({"text": "text", "int": "an integer", "real": "a number"}[kind])
    return v
