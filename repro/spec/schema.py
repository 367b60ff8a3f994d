"""Load the shipped JSON Schemas and validate YAML documents against them.

Every problem is reported at once, each located at ``file:line`` by walking the YAML
node tree that PyYAML composes, and phrased for a person with a hint where one helps.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import threading
import weakref
from collections.abc import Iterator, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from repro.errors import InputError, Problem
from repro.fastyaml import libyaml

if TYPE_CHECKING:  # imported when a document is validated: commands that only parse logs never pay for it
    import jsonschema


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``repro/spec/schemas/<name>.json`` as a dict."""
    text = resources.files("repro.spec.schemas").joinpath(f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)


#: Input files larger than this are refused before parsing (the shipped manifests are under 20 KiB).
MAX_YAML_BYTES = 1 << 20


def _anchored(pattern: str) -> str:
    """A JSON Schema (ECMA-262) pattern in Python's dialect: ``$`` is the end of the text, as in
    ECMA-262, not "the end or before a final newline" as in Python (``\\Z`` there)."""
    return re.sub(r"(?<!\\)((?:\\\\)*)\$", r"\1\\Z", pattern)


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(_anchored(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    import jsonschema

    if isinstance(instance, str) and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _strict_integer(checker: Any, instance: Any) -> bool:
    """A whole number written as one: 8, not 8.0 (which JSON Schema counts as an integer) or true."""
    return isinstance(instance, int) and not isinstance(instance, bool)


@cache
def strict_validator_class() -> Any:
    """Draft 2020-12 with ECMA-262 anchors and integers that are ints (every schema of the kit)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    return jsonschema.validators.extend(base, validators={"pattern": _pattern},
                                        type_checker=base.TYPE_CHECKER.redefine("integer", _strict_integer))


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = load_schema(name)
    cls = strict_validator_class()
    cls.check_schema(schema)
    return cls(schema)


class YamlDoc:
    """A parsed YAML document that remembers where each value came from."""

    def __init__(self, path: Path, node: yaml.Node | None, data: Any) -> None:
        self.path = path
        self.node = node
        self.data = data

    def line(self, field_path: Sequence[str | int], *, key: bool = False) -> int | None:
        """1-based line of the value at ``field_path`` (or of its key), else of the nearest parent."""
        node = self.node
        line = node.start_mark.line + 1 if node is not None else None
        for i, part in enumerate(field_path):
            child, key_node = _child(node, part)
            if child is None:
                break
            last = i == len(field_path) - 1
            node = child
            line = (key_node if (key and last and key_node is not None) else child).start_mark.line + 1
        return line

    def problem(self, field_path: Sequence[str | int], message: str, hint: str | None = None) -> Problem:
        return Problem(str(self.path), self.line(field_path), dotted(field_path), message, hint)

    def problem_at_key(self, field_path: Sequence[str | int], message: str,
                       hint: str | None = None) -> Problem:
        return Problem(str(self.path), self.line(field_path, key=True), dotted(field_path), message, hint)


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node | None, yaml.Node | None]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == part:
                return v, k
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part], None
    return None, None


def dotted(field_path: Sequence[str | int]) -> str:
    out = ""
    for part in field_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_STR_TAG = "tag:yaml.org,2002:str"


def _key_problems(node: yaml.Node | None,
                  path: list[str | int]) -> Iterator[tuple[list[str | int], int, str, str]]:
    """Duplicate keys, and keys YAML reads as something other than text (``OFF:`` is a boolean)."""
    stack = [(node, path)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for k, v in node.value:
                if k.value in seen:
                    yield ([*path, k.value], k.start_mark.line + 1, "duplicate key",
                           "each key may appear once in a mapping")
                elif not isinstance(k, yaml.ScalarNode) or k.tag != _STR_TAG:
                    yield ([*path, str(k.value) if isinstance(k, yaml.ScalarNode) else "?"],
                           k.start_mark.line + 1,
                           f"key {k.value if isinstance(k, yaml.ScalarNode) else '(a collection)'!s} "
                           f"is not text (YAML reads it as {k.tag.rsplit(':', 1)[-1]})",
                           "quote the key, e.g. \"OFF\":")
                seen.add(k.value)
                stack.append((v, [*path, k.value]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, [*path, i]) for i, v in enumerate(node.value))


class StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases: ``*name`` (and so ``<<: *name``) is refused, which bounds the
    document by the size of the file (no "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} is not allowed "
                                              "(write the value out; aliases are refused)", event.start_mark)
        return super().compose_node(parent, index)


def read_bounded(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; FIFOs, devices and larger files are refused
    at once (the file is opened without blocking and checked before anything is read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError([Problem(str(path), None, "", "no such file")]) from None
    except OSError as e:
        raise InputError([Problem(str(path), None, "", f"cannot read: {e.strerror}")]) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory with IsADirectoryError
        os.close(fd)
        what = "is a directory, not a file" if stat.S_ISDIR(st.st_mode) else \
            "not a regular file (a FIFO, socket or device)"
        raise InputError([Problem(str(path), None, "", what, "give a file")])
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise InputError([Problem(str(path), None, "",
                                      f"{st.st_size} bytes, over the {limit}-byte limit for "
                                      "an input file", "a manifest or hosts file is a few KiB")])
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError([Problem(str(path), None, "", f"over the {limit}-byte limit for an input file")])
    return data


def _compose_with(loader: Any) -> tuple[yaml.Node | None, Any]:
    try:
        node = loader.get_single_node()
        return node, loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _compose(text: str) -> tuple[yaml.Node | None, Any]:
    """The node tree and the data of a YAML text. libyaml reads it (about ten times faster) when it
    has no alias and few brackets; the pure-Python :class:`StrictLoader` reads it otherwise, so that a
    refused alias and a syntax error are reported in its words and at its lines, and a deeply nested
    flow collection stops at the recursion limit (libyaml's time grows with the square of the depth)."""
    if _FAST is not None and text.count("[") + text.count("{") <= _FAST_BRACKETS:
        try:
            if not any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=_FAST)):
                return _compose_with(_FAST(text))
        except yaml.YAMLError:
            pass
    return _compose_with(StrictLoader(text))


#: libyaml's SafeLoader where PyYAML was built with it.
_FAST = libyaml(yaml.SafeLoader)
_FAST_BRACKETS = 1000


#: The node trees of the YAML texts read lately, up to this many characters of text in all (the shipped
#: catalog is ~270 KiB of text, ~10 MB of nodes): each table ``repro report`` resolves reads the whole
#: catalog again, and the pure-Python parser that keeps line numbers costs ~25 ms a manifest.
KEPT_YAML_CHARS = 512 << 10
_kept: dict[str, tuple[yaml.Node | None, Any]] = {}
_kept_lock = threading.Lock()


def _compose_kept(text: str) -> tuple[yaml.Node | None, Any]:
    """:func:`_compose`, once a text while it is kept (oldest out first); errors are raised each time."""
    with _kept_lock:
        hit = _kept.get(text)
    if hit is not None:
        return hit
    hit = _compose(text)
    if len(text) <= KEPT_YAML_CHARS // 8:
        with _kept_lock:
            while _kept and sum(map(len, _kept)) + len(text) > KEPT_YAML_CHARS:
                del _kept[next(iter(_kept))]
            _kept[text] = hit
    return hit


def read_yaml(path: Path) -> YamlDoc:
    """Parse one YAML file; syntax errors, aliases, non-text keys and duplicate keys become located
    problems; files over MAX_YAML_BYTES and anything but a regular file are refused."""
    try:
        text = read_bounded(path, MAX_YAML_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError([Problem(str(path), None, "",
                                  f"cannot read: not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    try:
        node, data = _compose_kept(text)
        data = copy.deepcopy(data)  # a copy: what a caller does to it stays its own
    except RecursionError:
        raise InputError([Problem(str(path), None, "", "nested too deeply to read",
                                  "flatten the document")]) from None
    except yaml.YAMLError as e:
        # an unclosed quote or bracket is reported where parsing gave up; the context
        # mark is where it opened, which is the line a person has to fix
        context = getattr(e, "context", None) or ""
        problem = getattr(e, "problem", None) or str(e)
        opened = "quoted scalar" in context or "flow" in context
        mark = getattr(e, "context_mark", None) if opened else getattr(e, "problem_mark", None)
        what = f"{problem} ({context.removeprefix('while ')} that starts on this line)" if opened else problem
        raise InputError([Problem(str(path), mark.line + 1 if mark else None, "",
                                  f"invalid YAML: {what}", "fix the YAML syntax at that line")]) from None
    doc = YamlDoc(path, node, data)
    dups = [Problem(str(path), line, dotted(p), what, hint)
            for p, line, what, hint in _key_problems(node, [])]
    if dups:
        raise InputError(dups)
    return doc


def validate(doc: YamlDoc, schema_name: str) -> list[Problem]:
    """All schema problems of ``doc`` as located, readable problems (empty when valid)."""
    if not isinstance(doc.data, dict):
        return [Problem(str(doc.path), doc.line([]), "", "expected a mapping at the top level",
                        f"see an example in the shipped files; schema {schema_name}")]
    if doc.node is not None and schema_name in _valid.get(doc.node, ()):
        return []
    errors = sorted(_validator(schema_name).iter_errors(doc.data),
                    key=lambda e: (list(map(str, e.absolute_path)), e.message))
    problems = [_explain(doc, e, schema_name) for e in errors if not _echo_of_failed_branch(e, schema_name)]
    if not problems and doc.node is not None:
        _valid.setdefault(doc.node, set()).add(schema_name)
    return problems


#: The kept node trees (see ``_kept``) whose data a schema found valid: a text read again is not
#: validated again (its data is a fresh copy of what was constructed from the same tree). Weak, so an
#: entry goes when its tree leaves ``_kept``.
_valid: weakref.WeakKeyDictionary[yaml.Node, set[str]] = weakref.WeakKeyDictionary()


def _echo_of_failed_branch(err: jsonschema.ValidationError, schema_name: str) -> bool:
    """'unevaluatedProperties' also fires for known keys whose own check failed; that is noise."""
    if err.validator != "unevaluatedProperties" or not isinstance(err.instance, dict):
        return False
    schema = err.schema if isinstance(err.schema, dict) else {}
    return not set(err.instance) - _allowed_keys(schema_name, schema)


def _explain(doc: YamlDoc, err: jsonschema.ValidationError, schema_name: str) -> Problem:
    path = list(err.absolute_path)
    schema = err.schema if isinstance(err.schema, dict) else {}
    hint = schema.get("description")
    v = err.validator
    if v in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted(_allowed_keys(schema_name, schema))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        key = extra[0] if extra else ""
        if key == "ofed" and not path:
            return doc.problem_at_key([key], "unknown key 'ofed'",
                                      "it is now `rdma: {strategy: image | mlnx-ofed | "
                                      "inbox}`; leave it out for a target without RDMA (was kind: none)")
        return doc.problem_at_key([*path, key], f"unknown key {key!r}",
                                  f"allowed keys here: {', '.join(allowed)}" if allowed else None)
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return doc.problem(path, f"missing required key {missing!r}", _required_hint(schema, missing))
    if v == "const" and path == ["schema_version"]:
        return doc.problem(path,
                           f"unsupported version: required {err.validator_value}, found {err.instance!r}",
                           "this kit reads schema_version 1")
    if v == "enum":
        return doc.problem(path,
                           f"{err.instance!r} is not one of: {', '.join(map(str, err.validator_value))}",
                           hint)
    if v == "type":
        want = err.validator_value
        extra = ""
        if want == "string" and isinstance(err.instance, (int, float)):
            extra = (" (quote published figures so their printed precision is kept)"
                     if path[-1:] in (["value"], ["speedup"])
                     or (len(path) > 1 and path[-2] == "repeats") else " (quote it to keep it as text)")
        return doc.problem(path,
                           f"expected {want}, found {type(err.instance).__name__} {err.instance!r}{extra}",
                           hint)
    if v == "pattern":
        return doc.problem(path, f"{err.instance!r} does not match the required form {err.validator_value}",
                           hint)
    if (v in ("minProperties", "maxProperties") and set(schema.get("properties", {}))
            and schema.get("maxProperties") == 1):
        return doc.problem(path, f"give exactly one of: {', '.join(schema['properties'])}", None)
    if v == "not" and path and path[-1:] and isinstance(err.instance, dict):
        return doc.problem(path, "contradictory keys: " + _not_message(err), None)
    if v == "minItems" and err.validator_value == 1:
        return doc.problem(path, "must not be empty", hint)
    if v == "uniqueItems" and isinstance(err.instance, list):
        dup = next(x for i, x in enumerate(err.instance) if x in err.instance[:i])
        return doc.problem(path, f"{dup!r} is listed more than once", "list each item once")
    return doc.problem(path, err.message, hint)


def _allowed_keys(schema_name: str, schema: dict[str, Any]) -> set[str]:
    keys = set(schema.get("properties", {}))
    for sub in [schema, *schema.get("allOf", [])]:
        if "$ref" in sub:
            keys |= set(_resolve(schema_name, sub["$ref"]).get("properties", {}))
        elif sub is not schema:
            keys |= set(sub.get("properties", {}))
    return keys


def _resolve(schema_name: str, ref: str) -> dict[str, Any]:
    """A local '#/$defs/name' reference of the named schema."""
    return load_schema(schema_name).get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})


def _required_hint(schema: dict[str, Any], key: str) -> str | None:
    if key in ("version", "sha256", "flags") and "if" in schema:
        return ("rdma strategy mlnx-ofed pins version, sha256 (\"\" until verified: `repro lock` records it) "
                "and the publisher's installer flags, e.g. version: 5.0-2.1.8.0, sha256: \"\", "
                "flags: [--user-space-only]")
    sub = schema.get("properties", {}).get(key, {})
    if isinstance(sub, dict) and "$ref" in sub and sub["$ref"].endswith("/digest"):
        return "write digest: \"\" and run `repro lock TARGET` to fill it"
    return sub.get("description") if isinstance(sub, dict) else None


def _not_message(err: jsonschema.ValidationError) -> str:
    keys = [k for k in ("log", "logs", "version", "sha256", "flags", "url") if k in err.instance]
    if {"log", "logs"} <= set(keys):
        return "give either 'log' or 'logs', not both"
    return (f"{' and '.join(repr(k) for k in keys)} {'is' if len(keys) == 1 else 'are'} "
            "only for rdma strategy 'mlnx-ofed'")

