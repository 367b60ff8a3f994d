"""Python dependencies locked as they were: ``<manifest stem>.requirements.lock`` beside the image lock.

A manifest whose build installs Python packages declares ``image.build.deps``: the cutoff (the publication's
run date where its logs show one, else the end of the base tag's month) and why. ``repro lock`` resolves the
build's requirements once with uv (``uv pip compile --exclude-newer CUTOFF --generate-hashes``) for the base's
declared Python (``image.build.base.python``) on manylinux x86_64, treating the distributions the base ships
(``image.build.base.ships``) as installed: each is pinned at its declared version for the resolution (so their
own requirements hold) and left out of the lock, and every name one ``provides`` is overridden away, so that
no second TensorFlow beside ``tensorflow-gpu`` is ever resolved. The lock's header records the inputs; its
last line is the sha256 of everything above it, so that a build refuses a lock that is missing, stale (other
inputs) or edited. Checks of a lock (``lock_problems``) are pure; ``upload_problems`` asks the package index
(PEP 691). VCS requirements become wheels pinned by commit (repro.images.vcs). A distribution the base
ships that no index has (NGC's own torch builds: ``index: false``) is not resolved at all: requirements on it,
and on every name it provides, are taken as met by the base; one that stands for a release the index has
(``resolve_as``) is pinned at that release for the resolution.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro import bounded
from repro.errors import BuildError, UsageError
from repro.images import vcs
from repro.images.source import Mirrors
from repro.spec.manifest import Manifest

PLATFORM = "x86_64-manylinux_2_17"
DEFAULT_INDEX = "https://pypi.org/simple"
NEVER = "sys_platform == 'never'"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==| @ )")
_SEAL = re.compile(r"^# sha256 of the lines above: ([0-9a-f]{64})\n?$")
#: the lines of a lock below its header: a pinned distribution (or a VCS wheel the kit built) continued
#: onto its hash lines, each hash line continued but the last; the kit's own --index-url line; comments
_ENTRY_LINE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*"
                         rf"|[A-Za-z0-9][A-Za-z0-9._-]* @ file://{vcs.IMAGE_WHEELS}/[A-Za-z0-9._+-]+\.whl)"
                         r" \\$")
_HASH_LINE = re.compile(r"^    --hash=sha256:[0-9a-f]{64}( \\)?$")
#: a lock larger than this is no lock `repro lock` wrote (the largest seed lock is some 60 KiB)
LOCK_MAX = 16 << 20


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def deps_lock_path(manifest: Manifest) -> Path:
    return manifest.path.with_name(f"{manifest.path.stem}.requirements.lock")


def declared(manifest: Manifest) -> dict | None:
    """``image.build.deps`` when the manifest locks its Python dependencies."""
    return manifest.image.get("build", {}).get("deps")


def shipped(manifest: Manifest) -> dict[str, str]:
    """Normalized name -> version of what the base ships, and of every name one provides."""
    out: dict[str, str] = {}
    for s in manifest.image["build"]["base"].get("ships", []):
        out[normalize(s["name"])] = s["version"]
        out.update({normalize(p): f"{s['version']} (as {s['name']})" for p in s.get("provides", [])})
    return out


def requirements_in(manifest: Manifest) -> list[str]:
    """What the build installs, as requirement lines (tf2-models: tf-models-official, and tensorflow-datasets
    where its version is pinned too)."""
    build = manifest.image["build"]
    if build["dockerfile"] == "tf2-models":
        args = build.get("args", {})
        return [f"tf-models-official=={args['TF_MODELS_OFFICIAL']}",
                *(f"tensorflow-datasets=={v}" for v in [args.get("TENSORFLOW_DATASETS")] if v)]
    reqs = declared(manifest) or {}
    if reqs.get("requirements"):
        return list(reqs["requirements"])
    raise UsageError(f"{manifest.id}: image.build.deps.requirements is missing",
                     hint="list the requirement lines the build installs (its requirements file)")


def header(manifest: Manifest, index_url: str) -> list[str]:
    deps, base = declared(manifest) or {}, manifest.image["build"]["base"]
    ships = ", ".join(f"{s['name']}=={s['version']}" + _ship_note(s) for s in base.get("ships", [])) \
        or "nothing declared"
    return [f"# repro dependency lock for {manifest.id}: pip install --require-hashes --no-deps -r this file",
            f"# cutoff: {deps.get('cutoff', '')}",
            f"# python: {base.get('python', {}).get('version', '')} {PLATFORM}",
            f"# base ships (not installed again): {ships}",
            f"# requirements: {'; '.join(requirements_in(manifest))}",
            f"# index: {index_url}",
            *([f"# constraints: {'; '.join(c['requirement'] for c in deps['constraints'])}"]
              if deps.get("constraints") else [])]


def _ship_note(ship: Mapping[str, Any]) -> str:
    notes = [f"provides {', '.join(ship['provides'])}"] if ship.get("provides") else []
    notes += [f"resolved as {ship['resolve_as']}"] if ship.get("resolve_as") else []
    notes += ["on no index: taken as met"] if not ship.get("index", True) else []
    return f" ({'; '.join(notes)})" if notes else ""


def seal(lines: Sequence[str]) -> str:
    body = "".join(ln + "\n" for ln in lines)
    return body + f"# sha256 of the lines above: {hashlib.sha256(body.encode()).hexdigest()}\n"


def drop_blocks(text: str, names: Mapping[str, str]) -> list[str]:
    """uv's output without its comments and without the blocks (a pin and its hash lines) of ``names``."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("#") or line.strip().startswith("# via") or not line.strip():
            continue
        m = _ENTRY.match(line)
        if m:
            skipping = normalize(m.group(1)) in names
        if not skipping and not line.lstrip().startswith("#"):
            out.append(line)
    return out


def checked_index(url: str) -> str:
    """The package index URL, refused unless it is http(s) or file (never an option or a transport helper)."""
    if not re.match(r"^(https?|file)://[^\s]+$", url):
        raise UsageError(f"index URL {url!r} is not an http://, https:// or file:// URL",
                         hint="e.g. --index-url https://pypi.org/simple")
    return url


def uv_command() -> list[str]:
    return [sys.executable, "-m", "uv"]


def _resolution_inputs(manifest: Manifest, wheels: Sequence[vcs.Wheel]) -> tuple[list[str], list[str]]:
    """uv's requirement lines (the index requirements, each VCS wheel by path, the base's distributions that
    an index has, pinned) and its overrides (every name the base provides, and the distributions no index
    has, taken as met)."""
    ships = manifest.image["build"]["base"].get("ships", [])
    plain, _ = vcs.split(requirements_in(manifest))
    lines = [*plain, *(f"{w.requirement.name} @ {w.path.resolve().as_uri()}" for w in wheels),
             *(f"{s['name']}=={s.get('resolve_as', s['version'])}" for s in ships if s.get("index", True))]
    met = [p for s in ships for p in s.get("provides", [])]
    met += [s["name"] for s in ships if not s.get("index", True)]
    return lines, [f"{name} ; {NEVER}" for name in met]


def compile_lock(manifest: Manifest, index_url: str = DEFAULT_INDEX, mirrors: Mirrors = (),
                 run: Callable[..., Any] = subprocess.run) -> str:
    """The lock's text, resolved now with uv for the manifest's Python, platform and cutoff."""
    deps, base = declared(manifest), manifest.image["build"]["base"]
    if deps is None or "python" not in base:
        raise UsageError(f"{manifest.id}: nothing to lock", hint="declare image.build.deps (cutoff, why) and "
                         "image.build.base.python")
    index_url = checked_index(index_url)
    _, wanted = vcs.split(requirements_in(manifest))
    wheels = [vcs.wheel_for(r, deps["cutoff"], manifest.path.parent, mirrors, index_url) for r in wanted]
    inputs, overrides = _resolution_inputs(manifest, wheels)
    with tempfile.TemporaryDirectory(prefix="repro-deps-") as tmp:
        (Path(tmp) / "in.txt").write_text("".join(r + "\n" for r in inputs), encoding="utf-8")
        (Path(tmp) / "over.txt").write_text("".join(o + "\n" for o in overrides), encoding="utf-8")
        (Path(tmp) / "constraints.txt").write_text("".join(c["requirement"] + "\n" for c in
                                                           deps.get("constraints", [])), encoding="utf-8")
        argv = [*uv_command(), "pip", "compile", str(Path(tmp) / "in.txt"),
                "--overrides", str(Path(tmp) / "over.txt"),
                "--constraints", str(Path(tmp) / "constraints.txt"),
                "--python-version", base["python"]["version"], "--python-platform", PLATFORM,
                "--exclude-newer", deps["cutoff"], "--generate-hashes", "--index-url", index_url,
                "--no-header", "--no-annotate", "--quiet", "--no-cache", "--native-tls",
                "--python", sys.executable]   # uv builds with this one; it resolves for --python-version
        env = {**os.environ, "UV_NO_CONFIG": "1"}
        proc = run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{manifest.id}: the requirements do not resolve as of {deps['cutoff']}: "
                         f"{_last_lines(proc.stderr)}")
    names = {normalize(s["name"]): s["version"] for s in base.get("ships", [])}
    names.update({normalize(w.requirement.name): "" for w in wheels})
    # pip in the build reads the same index (any other that serves the same files would pass the hashes too)
    where = [] if index_url == DEFAULT_INDEX else [f"--index-url {index_url}"]
    return seal([*header(manifest, index_url), *where, *drop_blocks(proc.stdout, names),
                 *(line for w in wheels for line in vcs.lock_lines(w))])


def _last_lines(text: str, n: int = 6) -> str:
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-n:])


def pins(text: str) -> dict[str, str]:
    """Normalized name -> version of every pin in a lock."""
    return {normalize(m.group(1)): m.group(2) for line in text.splitlines() if (m := _PIN.match(line))}


def pin_count(text: str) -> int:
    """How many distributions a lock installs: index pins and VCS wheels."""
    return len(pins(text)) + len(vcs.direct_pins(text))


def read_lock_text(manifest: Manifest) -> str | None:
    """The text of the target's dependency lock (None: there is none); one that is not UTF-8 text or is
    larger than LOCK_MAX is a UsageError naming it."""
    path = deps_lock_path(manifest)
    try:
        with path.open("rb") as f:
            data = f.read(LOCK_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it: {e.strerror}") from None
    again = f"run `repro lock {manifest.id} --deps-only` again"
    if len(data) > LOCK_MAX:
        raise UsageError(f"{path}: over {LOCK_MAX} bytes, no lock `repro lock` writes: {again}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): "
                         f"{again}") from None


def line_problems(text: str, name: str) -> list[str]:
    """Lines of a lock's body that pip would read as something other than a pinned distribution with its
    hashes (another index, a requirements file, an editable or URL requirement, an option): each named."""
    out, continued = [], False
    own_index = f"--index-url {index_of(text)}"
    body = text.splitlines()[:-1]
    for n, line in enumerate(body, 1):
        if continued:
            ok = bool(_HASH_LINE.match(line))
        else:
            ok = not line or line.startswith("#") or line == own_index or bool(_ENTRY_LINE.match(line))
        continued = line.endswith("\\")  # a bad line's hash lines are its own, not another problem
        if not ok or continued and n == len(body):
            out.append(f"{name} line {n}: {line[:80]!r} is not a pinned distribution with its hashes "
                       "(name==version \\ --hash=sha256:...): the lock was edited; run `repro lock` again")
    return out


def index_problems(manifest: Manifest, text: str, named_index: str | None) -> list[str]:
    """A lock whose ``# index:`` is plain http to another machine, which the command line (``named_index``)
    did not name: what that index answers (upload times, what resolves) anyone on the way could write."""
    locked = index_of(text)
    host = urllib.parse.urlsplit(locked).hostname or ""
    if not locked.startswith("http://") or locked == named_index or host in ("localhost", "::1") \
            or host.startswith("127."):
        return []
    return [f"{deps_lock_path(manifest).name} reads its index over plain http ({locked}): anyone on the way "
            "can answer for it; give it with --index-url to accept it"]


def lock_problems(manifest: Manifest, text: str | None, index_url: str | None = None) -> list[str]:
    """What is wrong with a target's lock, offline: missing, edited, made for other inputs, installing a
    second distribution of one the base ships, or holding a line that is no hashed pin. One message per
    problem."""
    path = deps_lock_path(manifest)
    if text is None:
        return [f"{path.name} is missing: run `repro lock {manifest.id} --deps-only`"]
    lines = text.splitlines(keepends=True)
    sealed = _SEAL.match(lines[-1]) if lines else None
    if sealed is None or hashlib.sha256("".join(lines[:-1]).encode()).hexdigest() != sealed.group(1):
        return [f"{path.name} was changed after `repro lock` wrote it "
                "(its last line's sha256 does not match)"]
    problems = line_problems(text, path.name)
    want = header(manifest, index_url or index_of(text))
    have = [ln.rstrip("\n") for ln in lines[:len(want)]]
    for w, h in zip(want, have, strict=False):
        if w != h:
            problems.append(f"{path.name} was made for other inputs: it says {h[2:]!r}, "
                            f"the manifest gives {w[2:]!r}")
    problems += vcs.problems(text, manifest.path.parent)
    base = shipped(manifest)
    for name, version in {**pins(text), **vcs.direct_pins(text)}.items():
        if name in base:
            problems.append(f"{name}=={version} is a second distribution of {name} {base[name]}, "
                            "which the base ships (image.build.base.ships)")
    return problems


def index_of(text: str) -> str:
    return next((ln.split(": ", 1)[1].strip() for ln in text.splitlines() if ln.startswith("# index: ")), "")


#: PEP 700's upload-time: ISO 8601, UTC
_UPLOAD_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
                          r"(?:Z|[+-]00:00)")
#: the whole of one answer of the package index, headers to last byte, within this many seconds
INDEX_DEADLINE_S = 60.0
#: and no larger than this (PyPI's JSON page of its largest projects is a few MiB)
INDEX_MAX_BYTES = 64 << 20


def _fetch_json(url: str) -> Any:
    """The JSON document at ``url``, read whole within INDEX_DEADLINE_S and INDEX_MAX_BYTES (else OSError)."""
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    body = bounded.fetch(req, deadline_s=INDEX_DEADLINE_S, max_bytes=INDEX_MAX_BYTES).body
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not a JSON document: {type(e).__name__}") from None


def _uploads(doc: Any) -> list[tuple[str, str]]:
    """(file name, upload time) of each file a PEP 691 project page lists with an upload time; a page of
    another shape is a ValueError saying what is wrong."""
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise ValueError("not a PEP 691 project page (no list of files)")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
            raise ValueError("a file entry without a file name (not PEP 691)")
        when = f.get("upload-time")
        if when is not None and not (isinstance(when, str) and _UPLOAD_TIME.fullmatch(when)):
            raise ValueError(f"upload-time {str(when)[:40]!r} of {f['filename'][:80]} is no ISO 8601 UTC "
                             "time")
        if when:
            out.append((f["filename"], when))
    return out


def upload_problems(manifest: Manifest, text: str, index_url: str,
                    fetch: Callable[[str], Any] = _fetch_json) -> list[str]:
    """Pins whose release the index shows uploaded after the cutoff (PEP 691 ``upload-time``)."""
    cutoff, index_url = _when((declared(manifest) or {})["cutoff"]), checked_index(index_url)
    problems = []
    for name, version in sorted(pins(text).items()):
        try:
            uploads = _uploads(fetch(f"{index_url.rstrip('/')}/{name}/"))
            times = [_when(t) for filename, t in uploads if _version_of(filename, name) == version]
        except (OSError, ValueError) as e:
            problems.append(f"{name}: the index {index_url} cannot be read: {e}")
            continue
        if not times:
            problems.append(f"{name}=={version}: the index lists no file of it with an upload time")
        elif min(times) > cutoff:
            problems.append(f"{name}=={version} was uploaded {min(times):%Y-%m-%d}, after the cutoff "
                            f"{cutoff:%Y-%m-%d %H:%M:%S}Z (image.build.deps.cutoff)")
    return problems


def _version_of(filename: str, name: str) -> str:
    """The version a file's name carries (``py-cpuinfo-7.0.0.tar.gz``, ``py_cpuinfo-7.0.0-....whl``)."""
    parts = re.sub(r"(\.tar\.gz|\.zip|\.whl|\.tar\.bz2|\.egg)$", "", filename).split("-")
    return next((parts[i] for i in range(1, len(parts)) if normalize("-".join(parts[:i])) == name), "")


def _when(text: str) -> datetime:
    t = text.strip().replace("Z", "+00:00")
    value = datetime.fromisoformat(t if "T" in t or ":" in t else t + "T00:00:00+00:00")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def write_lock(manifest: Manifest, index_url: str = DEFAULT_INDEX,
               mirrors: Mirrors = ()) -> tuple[Path, bool]:
    """Resolve and write the target's dependency lock; whether its text changed."""
    text, path = compile_lock(manifest, index_url, mirrors), deps_lock_path(manifest)
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    if old != text:
        path.write_text(text, encoding="utf-8")
    return path, old != text
