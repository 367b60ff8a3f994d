"""MkDocs hook: a field reference generated from the kit's JSON schemas (repro/spec/schemas/*.json).

A page holds ``<!-- schema: NAME.json -->`` where the reference goes; the hook replaces it with one table row
per field (its path, type, whether it is required, and what the schema says of it: description, allowed
values, pattern, bounds, default). Nothing of it is written by hand, so the reference cannot drift from the
schema the kit validates with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parents[2] / "repro" / "spec" / "schemas"
MARK = re.compile(r"<!-- schema: ([\w.-]+\.json) -->")
_CONSTRAINTS = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "minProperties")


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The node with its ``$ref`` and ``allOf`` parts merged in (the schemas' own definitions only)."""
    merged: dict[str, Any] = {}
    parts = [node] + list(node.get("allOf", []))
    for part in parts:
        if "$ref" in part:
            name = part["$ref"].rsplit("/", 1)[-1]
            merged = _merge(merged, _resolve(root["$defs"][name], root))
        merged = _merge(merged, {k: v for k, v in part.items() if k not in ("$ref", "allOf")})
    return merged


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if key in ("properties",) and key in out:
            out[key] = {**out[key], **value}
        elif key == "required" and key in out:
            out[key] = sorted(set(out[key]) | set(value))
        else:
            out[key] = value
    return out


def _type(node: dict[str, Any]) -> str:
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "anyOf" in node or "oneOf" in node:
        return " or ".join(_type(n) for n in node.get("anyOf", node.get("oneOf", [])))
    kind = node.get("type", "")
    return " or ".join(kind) if isinstance(kind, list) else (kind or "any")


def _what(node: dict[str, Any]) -> str:
    said = [node["description"]] if "description" in node else []
    if "pattern" in node:
        said.append(f"pattern `{node['pattern']}`")
    said += [f"{key} {node[key]}" for key in _CONSTRAINTS if key in node]
    if "default" in node:
        said.append(f"default `{json.dumps(node['default'])}`")
    names = node.get("propertyNames", {})
    if "enum" in names:
        said.append("keys: " + ", ".join(f"`{n}`" for n in names["enum"]))
    elif "pattern" in names:
        said.append(f"keys match `{names['pattern']}`")
    return "; ".join(said).replace("|", "\\|").replace("\n", " ")


def rows(node: dict[str, Any], root: dict[str, Any], path: str, required: bool,
         seen: tuple[str, ...] = ()) -> list[tuple[str, str, str, str]]:
    """(path, type, required, description) for this node and every field below it."""
    if not isinstance(node, dict):  # `true` / `false`: any value, or none
        return []
    ref = node.get("$ref", "")
    if ref and ref in seen:  # a recursive definition: named, not unfolded again
        return [(path, f"see `{ref.rsplit('/', 1)[-1]}`", "yes" if required else "", "")]
    node = _resolve(node, root)
    for branch in ("then", "else"):  # a conditional's fields are part of what the node may hold
        if isinstance(node.get(branch), dict):
            node = _merge(node, {k: v for k, v in node[branch].items() if k != "type"})
    out = [(path, _type(node), "yes" if required else "", _what(node))] if path else []
    seen = seen + ((ref,) if ref else ())
    need = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        out += rows(child, root, f"{path}.{name}" if path else name, name in need, seen)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out += rows(extra, root, f"{path}.<name>" if path else "<name>", False, seen)
    items = node.get("items")
    if isinstance(items, dict):
        out += rows(items, root, f"{path}[]", False, seen)
    for alt in (node.get("anyOf", []) + node.get("oneOf", [])):
        out += [r for r in rows(alt, root, path, False, seen) if r[0] != path]
    return out


def reference(name: str) -> str:
    """The Markdown reference of one schema file."""
    schema = json.loads((SCHEMAS / name).read_text())
    lines = [f"Generated from `repro/spec/schemas/{name}` ({schema.get('title', name)}).", "",
             "| field | type | required | what the schema says |", "|---|---|---|---|"]
    done: set[str] = set()
    for path, kind, required, what in rows(schema, schema, "", True):
        if path not in done:
            done.add(path)
            lines.append(f"| `{path}` | {kind} | {required} | {what} |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARK.sub(lambda m: reference(m.group(1)), markdown)
