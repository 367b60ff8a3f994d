"""``repro check``: hold a target's recipe against its sources before anything is built.

For each target: the pinned commit exists in its repository; every patch's old text
occurs exactly once (patches apply in order, as the build applies them); every file the
Dockerfile copies from the checkout or the build context exists; the source's own Dockerfile is FROM the base
(or the manifest says which image it is FROM and why); requirement files use no
``git://`` URL (GitHub no longer serves that protocol); for rdma strategy mlnx-ofed, the
base image declares its OS, its tag names no other OS, and a bundle in the cache is built
for that OS and has the recorded sha256; on a CUDA base published before NVIDIA's April 2022 apt key
rotation, no ``apt-get update`` of the build (the Dockerfile and the kit's layers) reads NVIDIA's CUDA
sources unless it installs NVIDIA's current keyring by checksum. Sources are read with git, through
``--git-mirror`` prefixes for sites without GitHub; a repository whose host cannot be reached is
``unverifiable`` (offline), a failure, never a pass. Nothing here prints.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from repro.digest import sha256_file
from repro.errors import BuildError, ReproError
from repro.images import deps, lock
from repro.images import rdma as rdma_layer
from repro.images.apt import APT_WORK
from repro.images.build import BuildOptions, build_args, dockerfile_dir
from repro.images.refs import parse_ref
from repro.images.render import render_build, render_dockerfile
from repro.images.source import Mirrors, git, mirrored, repository_url
from repro.spec.manifest import Manifest

#: what the kit itself puts into every build context (see dockerfiles/*/Dockerfile)
KIT_CONTEXT = ("repro-ca.crt", "wheels", "repro-base-check.py", "requirements.lock")
_COPY = re.compile(r"^\s*(COPY|ADD)\s+(.*)$", re.I)
_GIT_URL = re.compile(r"(?<![\w+])(?:git\+)?git://\S+")
_REQUIREMENTS = re.compile(r"requirements[^/]*\.txt$")
_OS_IN_TAG = re.compile(r"(ubuntu|centos|rhel|debian)(\d+(?:\.\d+)?)")
#: NVIDIA rotated the key of its CUDA apt repositories in April 2022 (new key 3bf863cc); images made before
#: carry the old one, and ``apt-get update`` over their CUDA sources fails with NO_PUBKEY A4B469963BF863CC
KEY_ROTATION = "2022-04"
_CUDA_REF = re.compile(r"(^|/)nvidia/|nvcr\.io/|cuda|-gpu", re.IGNORECASE)
_APT_UPDATE = re.compile(r"\bapt(?:-get)?((?:\s+-o\s*\S+|\s+-\S+)*)\s+update\b")
_KEYRING = re.compile(r"cuda-keyring[^\n]*\bsha256sum\b|\bsha256sum\b[^\n]*cuda-keyring")
#: git's words for a repository whose host cannot be reached (no network), as opposed to one that is wrong
_UNREACHABLE = re.compile(r"(?:Could not resolve host|Failed to connect to|Connection timed out"
                          r"|Connection refused|Network is unreachable"
                          r"|Temporary failure in name resolution)[^\n]*")
#: records one failed check: (check, message)
Fail = Callable[[str, str], None]


@dataclass(frozen=True)
class Failure:
    target: str
    check: str       # commit (or unverifiable: offline), patch, copy, requirements, base, rdma, checksum,
                     # apt, deps
    message: str

    def __str__(self) -> str:
        """One line with the cause; a tool's own output, where the message carries it, indented under it."""
        head, *rest = self.message.splitlines() or [""]
        return f"{self.target}: {self.check}: {head}" + "".join(f"\n    {ln}" for ln in rest if ln.strip())


@dataclass(frozen=True)
class Checked:
    target: str
    passed: tuple[str, ...] = ()         # what was verified, one phrase each
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class CheckOptions:
    git_mirrors: Mirrors = ()
    ofed_cache: Path | None = None
    dockerfiles: Path | None = None
    resolve: bool = False                # ask the package index too (repro check --resolve)
    index_url: str | None = None


@dataclass
class _Tree:
    """Files of one commit, read with git, with the patches applied so far layered on top."""

    git_dir: Path
    commit: str
    patched: dict[str, str] = field(default_factory=dict)

    def read(self, path: str) -> str | None:
        if path in self.patched:
            return self.patched[path]
        try:
            return git(["--git-dir", str(self.git_dir), "show", f"{self.commit}:{path}"], timeout=120)
        except BuildError:
            return None

    def exists(self, path: str) -> bool:
        if path in ("", ".") or path in self.patched:
            return True
        try:
            git(["--git-dir", str(self.git_dir), "cat-file", "-e", f"{self.commit}:{path}"], timeout=120)
        except BuildError:
            return False
        return True


def _git_dir(path: Path) -> Path | None:
    try:
        return Path(git(["-C", str(path), "rev-parse", "--absolute-git-dir"], timeout=60).strip())
    except (BuildError, ReproError):
        return None


@contextmanager
def _repository(url: str, commit: str) -> Iterator[Path]:
    """A git directory holding ``commit``: a local repository as it is, else a fetch into a temporary one."""
    local = url.removeprefix("file://")
    if local.startswith("/") and Path(local).is_dir():
        found = _git_dir(Path(local))
        if found is not None:
            yield found
            return
    with tempfile.TemporaryDirectory(prefix="repro-check-") as tmp:
        git(["init", "-q", "--bare", "--", tmp], timeout=60)
        try:
            git(["--git-dir", tmp, "fetch", "-q", "--depth", "1", "--", repository_url(url), commit])
        except BuildError:
            git(["--git-dir", tmp, "fetch", "-q", "--", repository_url(url),
                 "+refs/heads/*:refs/remotes/src/*", "+refs/tags/*:refs/tags/*"])
        yield Path(tmp)


def check_target(manifest: Manifest, opts: CheckOptions = CheckOptions()) -> Checked:
    """Every check of the module doc for one target; failures are returned, never raised."""
    passed: list[str] = []
    failures: list[Failure] = []

    def fail(check: str, message: str) -> None:
        failures.append(Failure(manifest.id, check, message))

    if manifest.source:
        src = manifest.source
        url = mirrored(src["repository"], opts.git_mirrors)
        try:
            with _repository(url, src["commit"]) as git_dir:
                tree = _Tree(git_dir, src["commit"])
                if not _has_commit(git_dir, src["commit"]):
                    fail("commit", f"{src['commit']} is not in {url}")
                else:
                    passed.append(f"commit {src['commit'][:12]} in {url}")
                    _patches(manifest, tree, passed, fail)
                    _upstream_requirements(manifest, tree, passed, fail)
                    _upstream_base(manifest, tree, passed, fail)
                    _copies(manifest, tree, opts, passed, fail)
        except ReproError as e:
            if (cause := _UNREACHABLE.search(str(e))) is None:
                fail("commit", _cannot_read(url, e))
            else:  # offline: not a verdict on the recipe, and never ok
                fail("unverifiable", f"offline: cannot reach {url} ({cause.group(0).strip()}), so its "
                     "commit, patches and files were not checked; " + mirror_advice(src["repository"],
                                                                                   src["commit"]))
    else:
        _copies(manifest, None, opts, passed, fail)
    _image_lock(manifest, passed, fail)
    _rdma(manifest, opts, passed, fail)
    _apt(manifest, opts, passed, fail)
    _deps(manifest, opts, passed, fail)
    return Checked(manifest.id, tuple(passed), tuple(failures))


_GIT_FAILED = re.compile(r"git (?:--git-dir \S+ )?([\w-]+) .*? failed: (.*)\Z", re.S)


def _cannot_read(url: str, e: ReproError) -> str:
    """The cause in one line (which git command failed), git's own lines after it."""
    m = _GIT_FAILED.match(str(e))
    return f"cannot read {url}: git {m[1]} failed\n{m[2]}" if m else f"cannot read {url}: {e}"


def mirror_advice(repository: str, commit: str) -> str:
    """How ``--git-mirror`` reaches ``repository`` where its host cannot be reached: what the option takes,
    with this repository as the example."""
    m = re.match(r"^([a-z+]+://[^/]+/)(.+)$", repository)
    prefix, rest = (m.group(1), m.group(2)) if m else (repository.rsplit("/", 1)[0] + "/",
                                                       repository.rsplit("/", 1)[-1])
    return ("read it from a mirror with --git-mirror PREFIX=URL: PREFIX the start of the repository's "
            "address, URL a directory or git server holding the rest as a repository with commit "
            f"{commit[:12]}, e.g. "
            f"--git-mirror {prefix}=/srv/git/ reads {repository} from /srv/git/{rest}")


def _has_commit(git_dir: Path, commit: str) -> bool:
    try:
        git(["--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"], timeout=60)
    except BuildError:
        return False
    return True


def _patches(manifest: Manifest, tree: _Tree, passed: list[str], fail: Fail) -> None:
    patches = (manifest.source or {}).get("patches", [])
    ok = 0
    for i, p in enumerate(patches):
        text = tree.read(p["file"])
        if text is None:
            fail("patch", f"source.patches[{i}]: no file {p['file']} at {tree.commit[:12]}")
            continue
        count = text.count(p["old"])
        if count != 1:
            fail("patch",
                 f"source.patches[{i}] ({p['file']}): the old text {_short(p['old'])} occurs {count} times, "
                 "not once")
            continue
        tree.patched[p["file"]] = text.replace(p["old"], p["new"], 1)
        ok += 1
    if patches and ok == len(patches):
        passed.append(f"{ok} patch(es) apply once each")


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _copied(manifest: Manifest, opts: CheckOptions) -> tuple[str, list[str]]:
    """The Dockerfile's name and the sources of its COPY/ADD lines from the build context (not --from)."""
    directory = dockerfile_dir(manifest, BuildOptions(dockerfiles=opts.dockerfiles))
    base = parse_ref(manifest.image["build"]["base"]["ref"]).with_digest("sha256:" + "0" * 64)
    text = render_dockerfile((directory / "Dockerfile").read_text(encoding="utf-8"),
                             build_args(manifest, base))
    sources = []
    for line in text.splitlines():
        m = _COPY.match(line)
        if not m:
            continue
        words = shlex.split(m.group(2))
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words if not w.startswith("--")][:-1]   # the last word is the destination
    return f"dockerfiles/{directory.name}/Dockerfile", sources


def _copies(manifest: Manifest, tree: _Tree | None, opts: CheckOptions, passed: list[str],
            fail: Fail) -> None:
    if "build" not in manifest.image:
        return
    name, sources = _copied(manifest, opts)
    directory = dockerfile_dir(manifest, BuildOptions(dockerfiles=opts.dockerfiles))
    found = 0
    for s in sources:
        path = posixpath.normpath(s).rstrip("/")
        if path == "source" or path.startswith("source/"):
            rel = posixpath.normpath(path.removeprefix("source").lstrip("/") or ".")
            if tree is None and rel != ".":
                fail("copy", f"{name} copies {s}, but the manifest has no source")
            elif tree is not None and not tree.exists(rel):
                fail("copy",
                     f"{name} copies {s}, which is not in "
                     f"{manifest.source['repository']} at "  # type: ignore[index]
                     f"{tree.commit[:12]}")
            else:
                found += 1
                if tree is not None and _REQUIREMENTS.search(rel):
                    _requirements(rel, tree, passed, fail)
        elif path.split("/", 1)[0] in KIT_CONTEXT or (directory / path).exists():
            found += 1
        else:
            fail("copy", f"{name} copies {s}, which is not in {directory}")
    if found == len(sources):
        passed.append(f"{found} file(s) {name} copies exist")


def _requirements(rel: str, tree: _Tree, passed: list[str], fail: Fail) -> None:
    text = tree.read(rel) or ""
    bad = [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
           for m in [_GIT_URL.search(line.split(" #", 1)[0])] if m]
    for n, url in bad:
        fail("requirements",
             f"{rel}:{n}: {url} uses git://, which GitHub no longer serves; add a source.patches "
             "entry that rewrites it to git+https://")
    if not bad:
        passed.append(f"{rel}: no git:// URL")


def _requirement_lines(text: str) -> list[str]:
    """A requirements file's requirement lines: comments, blank lines and trailing spaces gone."""
    return [ln.split(" #", 1)[0].strip() for ln in text.splitlines()
            if ln.split(" #", 1)[0].strip() and not ln.lstrip().startswith("#")]


def _upstream_requirements(manifest: Manifest, tree: _Tree, passed: list[str], fail: Fail) -> None:
    """The benchmark's requirements.txt at the commit (patches applied) uses no git:// URL, and
    image.build.deps.requirements, what the dependency lock resolves, is that file's requirement lines."""
    if "build" not in manifest.image or manifest.image["build"]["dockerfile"] != "requirements":
        return
    declared = (deps.declared(manifest) or {}).get("requirements")
    rel = posixpath.join((manifest.source or {}).get("subdir", ".") or ".", "requirements.txt")
    rel = posixpath.normpath(rel)
    text = tree.read(rel)
    if text is None:
        fail("copy", f"dockerfiles/requirements installs the requirements of {rel}, which is not in "
                     f"{(manifest.source or {}).get('repository', '')} at {tree.commit[:12]}")
        return
    _requirements(rel, tree, passed, fail)
    upstream = _requirement_lines(text)
    if declared is None:
        return   # _deps names the missing declaration
    if upstream != [ln.strip() for ln in declared]:
        fail("deps", f"image.build.deps.requirements {declared} differs from {rel} at {tree.commit[:12]} "
                     f"(patches applied): {upstream}; copy the file's requirement lines into the manifest")
    else:
        passed.append(f"image.build.deps.requirements is {rel} at {tree.commit[:12]}")


_ARG = re.compile(r"^\s*ARG\s+(\w+)=(\S+)\s*$", re.I | re.M)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.I | re.M)


def upstream_from(dockerfile: str) -> str | None:
    """The image a Dockerfile's first stage is FROM, its ``ARG NAME=default`` values put in (None: none)."""
    m = _FROM.search(dockerfile)
    if m is None:
        return None
    args = {a[1]: a[2] for a in _ARG.finditer(dockerfile[:m.start()])}
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda v: args.get(v[1] or v[2], v[0]), m[1])


def _upstream_base(manifest: Manifest, tree: _Tree, passed: list[str], fail: Fail) -> None:
    """The source's own Dockerfile, where it has one, is FROM the base the kit builds on, or the manifest
    declares the other image and why (image.build.upstream_from)."""
    build = (manifest.image or {}).get("build")
    rel = posixpath.join((manifest.source or {}).get("subdir", ""), "Dockerfile")
    text = tree.read(rel) if build else None
    if text is None or (found := upstream_from(text)) is None:
        return
    base, declared = build["base"]["ref"], build.get("upstream_from")
    if found == base:
        passed.append(f"{rel} is FROM {base}")
    elif declared and declared["ref"] == found:
        passed.append(f"{rel} is FROM {found}, the base is {base} (image.build.upstream_from says why)")
    else:
        fail("base", f"{rel} at {tree.commit[:12]} is FROM {found}, the manifest builds on {base}: build on "
             f"it, or give image.build.upstream_from {{ref: {found}, why: ...}}"
             + (f" (it says {declared['ref']})" if declared else ""))


def _image_lock(manifest: Manifest, passed: list[str], fail: Fail) -> None:
    """The image lock, where there is one: readable, of the shape `repro lock` writes."""
    try:
        if lock.read_lock(lock.lock_path(manifest)) is not None:
            passed.append(f"{lock.lock_path(manifest).name} reads")
    except ReproError as e:
        fail("lock", str(e))


def _rdma(manifest: Manifest, opts: CheckOptions, passed: list[str], fail: Fail) -> None:
    rdma = manifest.rdma
    if rdma is None or rdma.strategy == "image":
        return
    os_ = rdma_layer.base_os(manifest) or ""   # declared whenever the strategy is mlnx-ofed (manifest.py)
    ref = manifest.image.get("build", {}).get("base", {}).get("ref", "")
    tagged = _OS_IN_TAG.search(ref)
    if os_ and tagged and tagged.group(0) != os_:
        fail("rdma", f"the base {ref} names {tagged.group(0)}, but image.build.base.os is {os_}")
        return
    if rdma.strategy == "inbox":
        if os_ and not os_.startswith(("ubuntu", "debian")):
            fail("rdma", f"strategy inbox installs rdma-core with apt-get; the base OS {os_} has no apt-get")
        return
    name = rdma_layer.bundle_name(manifest)
    passed.append(f"MLNX_OFED bundle {name} matches the base OS {os_}")
    bundle = rdma_layer.cached_bundle(manifest, opts.ofed_cache)
    try:
        locked = lock.read_lock(lock.lock_path(manifest))
    except ReproError:
        locked = None  # said by _image_lock
    expected = rdma.sha256 or (locked.files.get(name, "") if locked else "")
    if bundle is None:
        return
    try:
        top = rdma_layer.tarball_top(bundle)
    except BuildError as e:
        fail("rdma", str(e))
        return
    if rdma_layer.bundle_distro(top) != os_:
        fail("rdma", f"{bundle} holds {top}, not a build for {os_}")
    if expected:
        got = sha256_file(bundle)
        if got != expected:
            source = "rdma.sha256" if rdma.sha256 else f"the lock {lock.lock_path(manifest).name}"
            fail("checksum", f"{bundle}: sha256 {got}, {source} has {expected}")
        else:
            passed.append(f"{bundle.name}: sha256 as recorded")


def cuda_base_before_rotation(manifest: Manifest) -> str | None:
    """The base's publication month when it is a CUDA image published before NVIDIA's apt key rotation
    (``unknown`` when it declares none), else None."""
    base = manifest.image.get("build", {}).get("base")
    if not base or not (manifest.expect.get("cuda") or _CUDA_REF.search(base["ref"])):
        return None
    m = re.match(r"\d{4}-\d\d", str(base.get("published", "")))
    if m is None:
        return "unknown"
    return m.group(0) if m.group(0) <= KEY_ROTATION else None


def unsafe_apt_updates(text: str) -> list[str]:
    """Where a rendered build runs ``apt-get update`` over every apt source of the image: neither with the
    distribution's sources only (repro.images.apt) nor after installing NVIDIA's keyring by checksum. One
    entry per such RUN, naming the Dockerfile or layer it is in."""
    found, part = [], "the Dockerfile"
    for run in re.split(r"\n(?=\S)", text.replace("\\\n", " ")):
        if run.startswith("# dockerfiles/"):
            part = run.split()[1]
        elif run.startswith("# then the "):
            part = run.removeprefix("# then the ").split(" (")[0]
        if not re.match(r"RUN\s", run) or _KEYRING.search(run):
            continue
        if any(f"Dir::Etc::SourceParts={APT_WORK}/" not in m.group(1) for m in _APT_UPDATE.finditer(run)):
            found.append(part)
    return found


def _apt(manifest: Manifest, opts: CheckOptions, passed: list[str], fail: Fail) -> None:
    published = cuda_base_before_rotation(manifest)
    if published is None:
        return
    base = manifest.image["build"]["base"]["ref"]
    text = render_build(manifest, parse_ref(base), opts.dockerfiles)
    bad = unsafe_apt_updates(text)
    when = ("of unknown date (image.build.base.published)" if published == "unknown"
            else f"published {published}, before NVIDIA's April 2022 CUDA apt key rotation")
    for part in dict.fromkeys(bad):
        fail("apt", f"{part} runs apt-get update on {base}, a CUDA base {when}: over the base's CUDA sources "
                    "it fails with NO_PUBKEY A4B469963BF863CC; read the distribution's sources only "
                    "(repro.images.apt.dist_apt_install) or install NVIDIA's cuda-keyring by pinned sha256 "
                    "first")
    if not bad and "apt-get" in text:
        passed.append(f"apt reads the distribution's sources only (CUDA base {when.split(',')[0]})")


def _installs_from_lock(manifest: Manifest, opts: CheckOptions) -> bool:
    directory = dockerfile_dir(manifest, BuildOptions(dockerfiles=opts.dockerfiles))
    return "requirements.lock" in (directory / "Dockerfile").read_text(encoding="utf-8")


def _deps(manifest: Manifest, opts: CheckOptions, passed: list[str], fail: Fail) -> None:
    """The Python dependency lock: offline from the file; with --resolve, against the package index too."""
    if deps.declared(manifest) is None:
        if "build" in manifest.image and _installs_from_lock(manifest, opts):
            name = manifest.image["build"]["dockerfile"]
            fail("deps", f"dockerfiles/{name} installs from a dependency lock, but the manifest declares no "
                         "image.build.deps: declare image.build.base.python and ships and image.build.deps "
                         f"(cutoff, why, requirements), then run `repro lock {manifest.id} --deps-only`")
        return
    path = deps.deps_lock_path(manifest)
    try:
        text = deps.read_lock_text(manifest)
    except ReproError as e:
        fail("deps", str(e))
        return
    problems = deps.lock_problems(manifest, text)
    problems += deps.index_problems(manifest, text, opts.index_url) if text is not None else []
    sealed = text is not None and not any("was changed after" in p for p in problems)
    if sealed and opts.resolve:
        assert text is not None
        index = opts.index_url or deps.index_of(text)
        problems += deps.upload_problems(manifest, text, index)
        try:
            fresh = deps.compile_lock(manifest, index, opts.git_mirrors)
        except ReproError as e:
            problems.append(f"the requirements no longer resolve from {index}: {e}")
        else:
            moved = {n: (v, deps.pins(fresh).get(n)) for n, v in deps.pins(text).items()
                     if deps.pins(fresh).get(n) != v}
            problems += [f"{n}=={v} in the lock resolves as {w or 'nothing'} now from {index}"
                         for n, (v, w) in sorted(moved.items())]
    for p in problems:
        fail("deps", p)
    if not problems:
        cutoff = manifest.image["build"]["deps"]["cutoff"]
        count = deps.pin_count(text or "")
        passed.append(f"{path.name}: {count} pins as of {cutoff}, no second distribution of what the base "
                      "ships" + ("; the index agrees" if opts.resolve else ""))
