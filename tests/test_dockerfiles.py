"""Images without Docker: Dockerfile and OFED rendering (exact text), refs, lock rules, probes, patches.

The expected Dockerfile texts are the seed targets' builds as a reader would write them
out by hand from the Dockerfiles and the manifests' pins; ``tests/data/images-rendered/``
holds the longer ones (regenerate with REPRO_REGEN=1 and read the diff before committing).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from repro import paths
from repro.errors import BuildError, ProvenanceError, UsageError
from repro.images import build, lock_target  # noqa: F401 - the package imports cleanly
from repro.images.rdma import bundle_name, describe, parse_probe, render_rdma_layer, versions_label
from repro.images.refs import Ref, parse_ref, retag
from repro.images.registry import classify
from repro.images.render import render_build, render_dockerfile
from repro.images.sshd import render_sshd_layer
from repro.images.source import apply_patches
from repro.images.lock import Pins, check, differences, lock_path, pins_for_run, read_lock, resolve_all
from repro.spec.manifest import Manifest, Rdma, find_target, load_manifest, manifest_files

RENDERED = Path(__file__).resolve().parent / "data" / "images-rendered"
D = "sha256:" + "d" * 64
E = "sha256:" + "e" * 64
#: every seed GPU target (the *-cpu targets check a cluster and are built by the integration tests)
SEEDS = sorted(p.stem for p in manifest_files() if not p.stem.endswith("-cpu"))


def pinned_base(target: str) -> Ref:
    m = find_target(target)
    return parse_ref(m.image["build"]["base"]["ref"]).with_digest(D)


# --- the seed Dockerfiles ----------------------------------------------------------------------------

def test_every_shipped_build_names_an_existing_dockerfile() -> None:
    for f in manifest_files():
        m = load_manifest(f)
        if "build" in m.image:
            assert (paths.dockerfiles_dir() / m.image["build"]["dockerfile"] / "Dockerfile").is_file(), m.id


def test_ngc_pytorch_renders_exactly() -> None:
    text = render_build(find_target("ngc-pytorch-rn50-v100"), pinned_base("ngc-pytorch-rn50-v100"))
    body = text.split("sees the CA bundle; the final stage copies the wheels it built, never the bundle.\n", 1)[1]
    assert text.startswith("# dockerfiles/requirements/Dockerfile for ngc-pytorch-rn50-v100\n")
    assert body == f"""ARG BASE=nvcr.io/nvidia/pytorch@{D}

FROM nvcr.io/nvidia/pytorch@{D} AS deps
ARG BASE_PYTHON=3.8
ARG BASE_SHIPS=torch==1.9.0a0+df837d0
COPY repro-base-check.py /tmp/repro-base-check.py
RUN "$(command -v python3 || command -v python)" /tmp/repro-base-check.py "3.8" torch==1.9.0a0+df837d0
COPY repro-ca.crt /etc/ssl/certs/repro-build-ca.crt
COPY wheels/ /tmp/wheels/
COPY requirements.lock /tmp/requirements.lock
RUN if [ -s /etc/ssl/certs/repro-build-ca.crt ]; then export PIP_CERT=/etc/ssl/certs/repro-build-ca.crt; fi \\
 && pip wheel --no-cache-dir --no-deps --require-hashes --find-links /tmp/wheels --wheel-dir /wheelhouse \\
      -r /tmp/requirements.lock

FROM nvcr.io/nvidia/pytorch@{D}
ARG SOURCE_PATH=/workspace/DeepLearningExamples
ARG SOURCE_SUBDIR=PyTorch/Classification/ConvNets
COPY --from=deps /wheelhouse /tmp/wheelhouse
RUN pip install --no-cache-dir --no-index --no-deps /tmp/wheelhouse/*.whl \\
 && rm -rf /tmp/wheelhouse
COPY source/ /workspace/DeepLearningExamples/
WORKDIR /workspace/DeepLearningExamples/PyTorch/Classification/ConvNets

# RDMA: strategy image: the base image's own MOFED user space is used; nothing is installed
"""


@pytest.mark.parametrize("target", SEEDS)
def test_seed_targets_render_as_recorded(target: str) -> None:
    text = render_build(find_target(target), pinned_base(target))
    golden = RENDERED / f"{target}.txt"
    if os.environ.get("REPRO_REGEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


#: NGC bases that DLPerf found without a working MOFED user space and reinstalled MLNX_OFED 4.9 into
REINSTALLED_ON_NGC = {"dlperf-ngc-pytorch-rn50-v100", "dlperf-ngc-pytorch-bert-v100", "dlperf-ngc-tf1-rn50-v100",
                      "dlperf-ngc-tf1-rn50-v100-xla", "dlperf-ngc-mxnet-rn50-v100"}


@pytest.mark.parametrize("target", SEEDS)
def test_every_seed_build_is_consistent_with_its_base(target: str) -> None:
    m = find_target(target)
    base = m.image["build"]["base"]
    text = render_build(m, pinned_base(target))
    os_ = base["os"]
    assert re.fullmatch(r"ubuntu\d\d\.04", os_) and base["published"], "every seed declares its base OS and tag date"
    named = re.search(r"ubuntu\d\d\.04", base["ref"])
    assert named is None or named.group(0) == os_
    bundles = re.findall(r"MLNX_OFED_LINUX-[0-9.-]+?-([a-z]+[0-9.]+)-x86_64", text)
    assert all(b == os_ for b in bundles), "an MLNX_OFED bundle is always built for the base's OS"
    strategy = m.rdma.strategy if m.rdma else None
    assert ("mlnxofedinstall" in text) == (strategy == "mlnx-ofed")
    needs_apt = strategy in ("mlnx-ofed", "inbox") or m.launch.kind == "mpi"   # the mpi launcher's sshd layer
    assert ("apt-get" in text) == needs_apt, "nothing is apt-installed otherwise"
    if base["ref"].startswith("nvcr.io/") and target not in REINSTALLED_ON_NGC:
        assert strategy in (None, "image"), "NGC images bring their own MOFED user space"
    if strategy == "image":
        assert ("# RDMA: strategy image: the base image's own MOFED user space is used; nothing is installed\n"
                "\n" + ("# then the mpi layer" if m.launch.kind == "mpi" else "")) in text + "\n"
    multi_node = max(m.matrix["nodes"]) > 1 and m.expect.get("interconnect") in ("infiniband", "roce")
    assert (m.rdma is not None) == multi_node, "a multi-node target over InfiniBand says how it reaches it"


@pytest.mark.parametrize("name", sorted(p.name for p in paths.dockerfiles_dir().iterdir()
                                        if (p / "Dockerfile").is_file() and p.name != "cpu-frameworks"))
def test_the_ca_bundle_never_reaches_the_last_stage(name: str) -> None:
    text = (paths.dockerfiles_dir() / name / "Dockerfile").read_text(encoding="utf-8")
    last_stage = re.split(r"^FROM ", text, flags=re.M)[-1]
    assert "repro-ca.crt" not in last_stage and "repro-build-ca.crt" not in last_stage
    assert text.splitlines()[0].startswith(f"# repro image {name}:")
    assert re.search(r"^ARG BASE$", text, re.M), "the base comes from the kit, pinned, never a default"


def test_only_mpi_targets_get_the_sshd_layer_and_it_is_part_of_their_identity(monkeypatch) -> None:
    mpi, torch = find_target("mpi-rn50-cpu"), find_target("torch-rn50-cpu")
    assert "# then the mpi layer" in render_build(mpi, pinned_base("mpi-rn50-cpu"))
    assert "# then the mpi layer" not in render_build(torch, pinned_base("torch-rn50-cpu"))
    before = build.build_inputs_sha256(mpi), build.build_inputs_sha256(torch)
    monkeypatch.setattr(build, "render_sshd_layer", lambda base: f"FROM {base}\nRUN true\n")
    assert build.build_inputs_sha256(mpi) != before[0], "a changed layer must rebuild the image"
    assert build.build_inputs_sha256(torch) == before[1]


def test_render_dockerfile_follows_arg_scoping() -> None:
    text = ("ARG BASE\nARG G=global\nFROM ${BASE} AS a\nRUN echo $G ${G}\nARG G\nRUN echo $G $HOME ${X}\n"
            "FROM $BASE\nARG X=x\nRUN echo ${X} $G\n")
    assert render_dockerfile(text, {"BASE": "img@" + D}) == (
        f"ARG BASE=img@{D}\nARG G=global\nFROM img@{D} AS a\nRUN echo $G ${{G}}\nARG G=global\n"
        f"RUN echo global $HOME ${{X}}\nFROM img@{D}\nARG X=x\nRUN echo x $G\n")


def test_render_marks_an_unpinned_base() -> None:
    m = find_target("ngc-tf1-rn50-v100")
    text = render_build(m, parse_ref(m.image["build"]["base"]["ref"]))
    assert "FROM nvcr.io/nvidia/tensorflow:20.12-tf1-py3@<not pinned> AS deps\n" in text


def test_build_args_may_not_override_the_pins() -> None:
    m = find_target("dlperf-tf2-rn50-v100")
    data = json.loads(json.dumps(m.data))
    assert build.build_args(m, pinned_base("dlperf-tf2-rn50-v100")) == {
        "BASE": f"tensorflow/tensorflow@{D}", "TF_MODELS_OFFICIAL": "2.3.0", "TENSORFLOW_DATASETS": "3.0.0",
        "BASE_PYTHON": "3.6", "BASE_SHIPS": "tensorflow-gpu==2.3.0"}  # image.build.base python and ships
    data["image"]["build"]["args"]["BASE"] = "evil:latest"
    forged = type(m)(**{**m.__dict__, "image": data["image"]})
    with pytest.raises(UsageError, match="may not set BASE"):
        build.build_args(forged, pinned_base("dlperf-tf2-rn50-v100"))


def test_label_step_is_one_instruction_with_quoted_values() -> None:
    assert build.label_step("sha256:abc", {"b": 'say "hi"', "a": "x y"}) == (
        b'FROM sha256:abc\nLABEL "a"="x y" "b"="say \\"hi\\""\n')


# --- RDMA ------------------------------------------------------------------------------------------

def with_rdma(target: str, rdma: dict | None, os_: str | None = None) -> Manifest:
    """A seed manifest with another rdma section (and base OS), as load_manifest would build it."""
    m = find_target(target)
    data = json.loads(json.dumps(m.data))
    data.pop("rdma", None)
    if rdma is not None:
        data["rdma"] = rdma
    if os_ is not None:
        data["image"]["build"]["base"]["os"] = os_
    return type(m)(**{**m.__dict__, "data": data, "image": data["image"],
                      "rdma": Rdma(**{**rdma, "flags": tuple(rdma.get("flags", ()))}) if rdma else None})


def test_inbox_layer_exact() -> None:
    m = with_rdma("paddle-rn50-v100", {"strategy": "inbox"})
    assert render_rdma_layer(m, "sha256:abc") == (
        "# repro RDMA layer: inbox (the distribution's rdma-core user space)\n"
        "FROM sha256:abc\n"
        "RUN mkdir -p /tmp/repro-apt/sources.list.d \\\n"
        + "".join(f" && {c} \\\n" for c in DIST_APT[1:])
        + " && apt-get -o Dir::Etc::SourceList=/tmp/repro-apt/sources.list "
        "-o Dir::Etc::SourceParts=/tmp/repro-apt/sources.list.d update \\\n"
        " && DEBIAN_FRONTEND=noninteractive apt-get -o Dir::Etc::SourceList=/tmp/repro-apt/sources.list "
        "-o Dir::Etc::SourceParts=/tmp/repro-apt/sources.list.d install -y --no-install-recommends "
        "ibverbs-providers ibverbs-utils infiniband-diags perftest rdma-core \\\n"
        " && rm -rf /var/lib/apt/lists/* /tmp/repro-apt \\\n"
        " && mkdir -p /etc/libibverbs.d\n")


#: how the kit's layers copy the distribution's apt sources (Debian/Ubuntu one-line sources.list, Debian 12
#: and Ubuntu 24.04 deb822 files) and refuse an image that has none; NVIDIA's cuda.list and nvidia-ml.list
#: stay out
DIST_APT = (
    "mkdir -p /tmp/repro-apt/sources.list.d",
    ("if [ -f /etc/apt/sources.list ]; then cp /etc/apt/sources.list /tmp/repro-apt/sources.list; "
     "else : > /tmp/repro-apt/sources.list; fi"),
    ('for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/ubuntu.sources; '
     'do if [ -f "$f" ]; then cp "$f" /tmp/repro-apt/sources.list.d/; fi; done'),
    ("if ! grep -qsE '^[[:space:]]*(deb|Types:)' /tmp/repro-apt/sources.list "
     "/tmp/repro-apt/sources.list.d/*; then echo 'repro: the image has no distribution apt source (/etc/apt/sources.list, "
     "sources.list.d/debian.sources or ubuntu.sources)' >&2; exit 1; fi"))


def test_sshd_layer_exact() -> None:
    opts = ("-o Dir::Etc::SourceList=/tmp/repro-apt/sources.list "
            "-o Dir::Etc::SourceParts=/tmp/repro-apt/sources.list.d")
    assert render_sshd_layer("sha256:abc") == (
        "# repro mpi layer: the sshd (and ssh client) mpirun reaches the other nodes' ranks through\n"
        "FROM sha256:abc\n"
        "RUN if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null; then \\\n"
        "      command -v apt-get >/dev/null \\\n"
        "        || { echo 'repro: the image has no sshd and no apt-get to install openssh-server' >&2; "
        "exit 1; }; \\\n"
        f"      {DIST_APT[0]} \\\n"
        + "".join(f"        && {c} \\\n" for c in DIST_APT[1:])
        + f"        && apt-get {opts} update \\\n"
        f"        && DEBIAN_FRONTEND=noninteractive apt-get {opts} install -y --no-install-recommends "
        "openssh-server openssh-client \\\n"
        "        && rm -rf /var/lib/apt/lists/* /tmp/repro-apt \\\n"
        "        && rm -f /etc/ssh/ssh_host_*; \\\n"
        "    fi \\\n"
        " && mkdir -p /run/sshd \\\n"
        " && test -x /usr/sbin/sshd && ssh -V\n")


def test_mlnx_ofed_layer_takes_the_distro_from_the_base_os_and_the_publishers_flags() -> None:
    m = find_target("paddle-rn50-v100")
    name = "MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu16.04-x86_64"
    assert bundle_name(m) == name and describe(m) == "mlnx-ofed 5.0-2.1.8.0 ubuntu16.04"
    assert render_rdma_layer(m, "sha256:abc").splitlines()[2:4] == [
        "RUN . /etc/os-release \\",
        ' && test "$ID$VERSION_ID" = ubuntu16.04 || { echo "the base image is $ID$VERSION_ID, image.build.base.os '
        'says ubuntu16.04" >&2; exit 1; }']
    assert render_rdma_layer(m, "sha256:abc").splitlines()[-6:-1] == [
        f"COPY {name}.tgz /tmp/{name}.tgz",
        "RUN cd /tmp \\",
        f" && tar -xf {name}.tgz \\",
        f" && ./{name}/mlnxofedinstall --user-space-only --force --without-neohost-backend \\",
        f" && rm -rf /tmp/{name} /tmp/{name}.tgz \\",
    ]


def test_image_strategy_and_no_rdma_have_no_layer() -> None:
    for m in (find_target("ngc-tf1-rn50-v100"), find_target("tf-cnn-rn50-p100-real")):
        with pytest.raises(UsageError, match="installs nothing"):
            render_rdma_layer(m, "x")
    assert describe(find_target("ngc-tf1-rn50-v100")) == "image"
    assert describe(find_target("tf-cnn-rn50-p100-real")) == "none"
    assert versions_label({"b": "2", "a": "1"}) == "a=1 b=2"


def test_mlnx_ofed_without_a_base_os_is_refused() -> None:
    m = with_rdma("paddle-rn50-v100", {"strategy": "mlnx-ofed", "version": "5.0-2.1.8.0", "sha256": "",
                                       "flags": ["--force"]})
    data = json.loads(json.dumps(m.data))
    del data["image"]["build"]["base"]["os"]
    m = type(m)(**{**m.__dict__, "data": data, "image": data["image"]})
    with pytest.raises(UsageError, match="needs the base image's OS") as err:
        bundle_name(m)
    assert "image.build.base.os: ubuntu18.04" in (err.value.hint or "")


def test_rdma_accessor_is_the_strategy_or_none() -> None:
    seen = {f.stem: load_manifest(f).rdma for f in manifest_files()}
    assert {k: v.strategy for k, v in seen.items() if v} == {
        "dlperf-ngc-pytorch-rn50-v100": "mlnx-ofed", "dlperf-tf2-rn50-v100": "mlnx-ofed",
        "dlperf-pytorch-rn50-v100": "mlnx-ofed", "dlperf-pytorch-rn50-v100-w8": "mlnx-ofed",
        "dlperf-paddle-rn50-v100": "mlnx-ofed", "dlperf-paddle-rn50-v100-static": "mlnx-ofed",
        "dlperf-ngc-tf1-rn50-v100": "mlnx-ofed", "dlperf-ngc-tf1-rn50-v100-xla": "mlnx-ofed",
        "dlperf-oneflow-rn50-v100": "mlnx-ofed", "dlperf-ngc-mxnet-rn50-v100": "mlnx-ofed",
        "ngc-pytorch-rn50-v100": "image", "ngc-pytorch-rn50-v100-2.3": "image",
        "ngc-tf1-rn50-v100": "image", "ngc-tf1-rn50-v100-2.3": "image",
        "paddle-rn50-v100": "mlnx-ofed", "paddle-rn50-v100-2.3": "mlnx-ofed",
        "dlperf-oneflow-bert-v100": "mlnx-ofed", "dlperf-oneflow-bert-noclip-v100": "mlnx-ofed",
        "dlperf-ngc-pytorch-bert-v100": "mlnx-ofed", "dlperf-mxnet-gluoncv-rn50-v100": "mlnx-ofed",
        "dlperf-tf2-bert-v100": "mlnx-ofed", "dlperf-paddle-bert-v100": "mlnx-ofed"}
    assert seen["torch-rn50-cpu"] is None and seen["ngc-mxnet-rn50-v100"] is None


INBOX_OK = ("Failed to get IB devices list: Function not implemented\nrepro:ibv_devinfo_exit=255\nrepro:versions\n"
            "ibverbs-providers=44.0-2\nibverbs-utils=44.0-2\ninfiniband-diags=44.0-2\nperftest=4.5+0.17-1\n"
            "rdma-core=44.0-2\n")


def test_probe_accepts_a_host_without_hca_and_reads_versions() -> None:
    assert parse_probe("inbox", INBOX_OK)["rdma-core"] == "44.0-2"
    assert parse_probe("inbox", INBOX_OK.replace("Failed to get IB devices list: Function not implemented",
                                                 "No IB devices found"))["perftest"] == "4.5+0.17-1"
    with_hca = "hca_id: mlx5_0\nrepro:ibv_devinfo_exit=0\nrepro:versions\nMLNX_OFED_LINUX-4.9-0.1.7.0:\n"
    assert parse_probe("mlnx-ofed", with_hca) == {"ofed_info": "MLNX_OFED_LINUX-4.9-0.1.7.0"}


@pytest.mark.parametrize("output, message", [
    ("repro:missing ibv_devinfo\n", "not in the image"),
    ("ibv_devinfo: error while loading shared libraries: libibverbs.so.1\nrepro:ibv_devinfo_exit=127\n"
     "repro:versions\n", "does not run"),
    (INBOX_OK.replace("perftest=4.5+0.17-1\n", ""), "missing from the image: perftest"),
])
def test_probe_failures_are_build_errors(output: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        parse_probe("inbox", output)
    with pytest.raises(BuildError, match="did not name an MLNX_OFED version"):
        parse_probe("mlnx-ofed", "No IB devices found\nrepro:ibv_devinfo_exit=255\nrepro:versions\n"
                            "sh: ofed_info: not found\n")


# --- references --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, repo, tag, registry, path", [
    ("nvcr.io/nvidia/pytorch:21.03-py3", "nvcr.io/nvidia/pytorch", "21.03-py3", "nvcr.io", "nvidia/pytorch"),
    ("127.0.0.1:5000/repro-test/debian:bookworm", "127.0.0.1:5000/repro-test/debian", "bookworm", "127.0.0.1:5000",
     "repro-test/debian"),
    ("debian", "debian", "", "docker.io", "library/debian"),
    ("paddlepaddle/paddle-benchmark:2.5.0", "paddlepaddle/paddle-benchmark", "2.5.0", "docker.io",
     "paddlepaddle/paddle-benchmark"),
    ("localhost:5000/x", "localhost:5000/x", "", "localhost:5000", "x"),
])
def test_parse_ref(text: str, repo: str, tag: str, registry: str, path: str) -> None:
    r = parse_ref(text)
    assert (r.repository, r.tag, r.registry, r.path) == (repo, tag, registry, path)
    assert str(parse_ref(f"{text}@{D}")) == f"{text}@{D}"
    assert parse_ref(text, D).pinned == f"{repo}@{D}"


def test_refs_refuse_bad_input() -> None:
    for bad in ("", "UPPER/case:x", "x@sha256:123", "x:1@" + D + "x"):
        with pytest.raises(UsageError):
            parse_ref(bad)
    with pytest.raises(UsageError, match="but"):
        parse_ref(f"x@{D}", E)
    with pytest.raises(UsageError, match="not pinned"):
        _ = parse_ref("x:1").pinned


def test_retag_for_push() -> None:
    assert str(retag(parse_ref("repro/ngc-pytorch-rn50:21.03-fc9c09b"), "127.0.0.1:5000")) == \
        "127.0.0.1:5000/repro/ngc-pytorch-rn50:21.03-fc9c09b"
    assert str(retag(parse_ref("nvcr.io/nvidia/pytorch:21.03-py3", D), "reg.local/mirror/")) == \
        "reg.local/mirror/nvidia/pytorch:21.03-py3"
    with pytest.raises(UsageError):
        retag(parse_ref("x:1"), "https://reg")


def test_registry_errors_are_classified() -> None:
    refused = "Get http://127.0.0.1:5999/v2/: dial tcp 127.0.0.1:5999: connect: connection refused"
    assert classify(refused) == "unreachable"
    assert classify("manifest for 127.0.0.1:5000/x@sha256:00 not found: manifest unknown") == "unknown"
    assert classify("write /var/lib/docker/tmp/x: no space left on device") == "disk"
    assert classify("something else") == "other"


# --- lock rules --------------------------------------------------------------------------------------

@pytest.fixture
def tagged_manifest(tmp_path: Path):
    src = find_target("ngc-tf1-rn50-v100").path
    shutil.copyfile(src, tmp_path / src.name)
    return load_manifest(tmp_path / src.name)


def test_a_tag_without_digest_is_refused_unless_locked_or_allowed(tagged_manifest) -> None:
    m = tagged_manifest
    with pytest.raises(UsageError, match="tag without a digest"):
        pins_for_run(m, None, lambda r: D, allow_unpinned=False)
    assert pins_for_run(m, None, lambda r: D, allow_unpinned=True).images["base"].digest == D
    locked = Pins({"base": parse_ref(m.image["build"]["base"]["ref"], E)})
    assert pins_for_run(m, locked, lambda r: D, allow_unpinned=False).images["base"].digest == E


def test_lock_mismatch_fails_closed_naming_both_digests(tagged_manifest) -> None:
    m = tagged_manifest
    path, written = check(m, resolve_all(m, lambda r: D, None), update=False, allow_create=True)
    assert written and path == lock_path(m) and path.name == "ngc-tf1-rn50-v100.lock.json"
    assert check(m, resolve_all(m, lambda r: D, None), update=False) == (path, False)
    moved = pins_for_run(m, read_lock(path), lambda r: E, allow_unpinned=True)
    with pytest.raises(ProvenanceError) as err:
        check(m, moved, update=False)
    assert D in str(err.value) and E in str(err.value) and "--update-lock" in (err.value.hint or "")
    assert check(m, moved, update=True) == (path, True)
    assert read_lock(path).images["base"].digest == E


def test_lock_differences_name_what_changed() -> None:
    a = Pins({"base": parse_ref("x:1", D)}, {"source": {"repository": "r", "commit": "1" * 40}})
    b = Pins({"base": parse_ref("x:2", D)}, {"source": {"repository": "r", "commit": "2" * 40,
                                                         "branch": "main", "branch_commit": "3" * 40}})
    assert differences(a, a) == []
    assert differences(a, b) == [
        "base image: lock names x:1, the manifest x:2",
        f"source commit: lock has {'1' * 40}, the manifest {'2' * 40}",
        f"source branch main: lock has None, resolved {'3' * 40}",
    ]


def test_a_manifest_digest_wins_over_a_moved_tag(tagged_manifest) -> None:
    m = tagged_manifest
    data = m.data
    pinned = type(m)(**{**m.__dict__, "image": {"build": {**data["image"]["build"],
                                                           "base": {"ref": "nvcr.io/nvidia/tensorflow:20.12-tf1-py3",
                                                                    "digest": D}}}})
    warnings: list[str] = []
    pins = resolve_all(pinned, lambda r: E, None, warn=warnings.append)
    assert pins.images["base"].digest == D and E in warnings[0]


def test_lock_records_the_mlnx_bundle_sha256_and_the_build_and_dry_run_use_it(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.images import bundle_files, dry_run_text

    src = find_target("paddle-rn50-v100").path
    shutil.copyfile(src, tmp_path / src.name)
    m = load_manifest(tmp_path / src.name)
    cache = tmp_path / "cache"
    cache.mkdir()
    name = "MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu16.04-x86_64"
    sha = bundle(cache / f"{name}.tgz", top=name)
    monkeypatch.setenv("REPRO_OFED_CACHE", str(cache))
    assert build.expected_bundle_sha256(m) == ""
    assert f"{name}.tgz must have sha256 <not recorded: run repro lock" in dry_run_text(m)
    files = bundle_files(m)
    assert files == {name: sha}
    path, written = check(m, resolve_all(m, lambda r: D, None, files=files), update=False, allow_create=True)
    assert written and json.loads(path.read_text())["files"] == {name: sha}
    assert build.expected_bundle_sha256(m) == sha
    assert f"{name}.tgz must have sha256 {sha} (recorded by repro lock)\n" in dry_run_text(m)
    # a run carries the lock's record; a changed bundle is a difference naming both values
    assert pins_for_run(m, read_lock(path), lambda r: D, allow_unpinned=False).files == {name: sha}
    locked = read_lock(path)
    assert differences(locked, Pins(locked.images, locked.sources, {name: "f" * 64})) == [
        f"file {name}: lock has sha256 {sha}, found {'f' * 64}"]


# --- patches and build failures ----------------------------------------------------------------------

def test_patches_must_match_exactly_once(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\ny = 2\ny = 2\n")
    assert apply_patches(tmp_path, [{"file": "a.py", "old": "x = 1\n", "new": "x = 3\n", "why": "w"}]) == ["a.py"]
    assert (tmp_path / "a.py").read_text() == "x = 3\ny = 2\ny = 2\n"
    for old, count in (("y = 2\n", 2), ("z", 0)):
        with pytest.raises(BuildError, match=f"occurs {count} times"):
            apply_patches(tmp_path, [{"file": "a.py", "old": old, "new": "", "why": "w"}])
    with pytest.raises(BuildError, match="no file"):
        apply_patches(tmp_path, [{"file": "../a.py", "old": "x", "new": "", "why": "w"}])


def test_a_failed_build_names_its_step_and_last_lines(tmp_path: Path) -> None:
    tail = collections.deque((f"line {i}" for i in range(30)), maxlen=build.TAIL_LINES)
    failed = build._failed  # noqa: SLF001 - the message format is the contract under test
    err = failed("The command '/bin/sh -c make' returned a non-zero code: 2", "step 3/7: RUN make", tail,
                 tmp_path / "b.log")
    text = str(err)
    assert text.startswith("build failed at step 3/7: RUN make\nThe command '/bin/sh -c make' returned a non-zero "
                           "code: 2\nlast 20 lines of its output:\n  | line 10\n")
    assert text.endswith(f"  | line 29\nfull log: {tmp_path / 'b.log'}")
    assert err.exit_code == 4


# --- MLNX_OFED bundle staging ------------------------------------------------------------------------

MLNX_NAME = "MLNX_OFED_LINUX-4.9-0.1.7.0-ubuntu18.04-x86_64"


def bundle(path: Path, top: str = MLNX_NAME) -> str:
    """A small tar archive laid out like an MLNX_OFED bundle (one top directory); its sha256 hex."""
    import hashlib
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        data = b"#!/bin/sh\n"
        info = tarfile.TarInfo(f"{top}/mlnxofedinstall")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mlnx_bundle_from_the_cache_is_verified_before_it_enters_the_context(tmp_path: Path) -> None:
    from repro.images.rdma import stage_bundle

    m = find_target("dlperf-ngc-pytorch-rn50-v100")
    cache, context = tmp_path / "cache", tmp_path / "ctx"
    cache.mkdir()
    context.mkdir()
    sha = bundle(cache / f"{MLNX_NAME}.tar")
    assert stage_bundle(m, context, sha, cache) == f"sha256:{sha}"
    assert (context / f"{MLNX_NAME}.tgz").read_bytes() == (cache / f"{MLNX_NAME}.tar").read_bytes()
    with pytest.raises(BuildError, match=f"sha256 {sha}, but {'0' * 64} was recorded"):
        stage_bundle(m, context, "0" * 64, cache)
    with pytest.raises(BuildError, match="no checksum to verify") as err:
        stage_bundle(m, context, "", cache)
    assert "repro lock" in (err.value.hint or "")


def test_mlnx_bundle_for_another_distro_is_refused(tmp_path: Path) -> None:
    from repro.images.rdma import stage_bundle

    m = find_target("dlperf-ngc-pytorch-rn50-v100")
    (tmp_path / "ctx").mkdir()
    sha = bundle(tmp_path / f"{MLNX_NAME}.tgz", top="MLNX_OFED_LINUX-4.9-0.1.7.0-ubuntu16.04-x86_64")
    with pytest.raises(BuildError, match="the bundle is for ubuntu16.04, the base image is ubuntu18.04"):
        stage_bundle(m, tmp_path / "ctx", sha, tmp_path)


def test_mlnx_bundle_is_downloaded_into_the_cache_once(tmp_path: Path) -> None:
    from repro.errors import EnvironmentUnavailable
    from repro.images.rdma import stage_bundle

    served = tmp_path / "served.tgz"
    sha = bundle(served)
    base = find_target("dlperf-ngc-pytorch-rn50-v100").data["rdma"]
    m = with_rdma("dlperf-ngc-pytorch-rn50-v100", {**base, "url": served.as_uri()})
    cache, context = tmp_path / "cache", tmp_path / "ctx"
    context.mkdir()
    events: list[object] = []
    stage_bundle(m, context, sha, cache, events.append)
    assert (cache / f"{MLNX_NAME}.tgz").read_bytes() == served.read_bytes() and len(events) == 1
    served.unlink()
    stage_bundle(m, context, sha, cache, events.append)   # cached: no download
    assert len(events) == 1
    other = with_rdma("dlperf-ngc-pytorch-rn50-v100", {**base, "version": "5.0-2.1.8.0", "url": served.as_uri()})
    with pytest.raises(EnvironmentUnavailable, match="cannot download MLNX_OFED") as err:
        stage_bundle(other, context, sha, cache)
    assert "MLNX_OFED_LINUX-5.0-2.1.8.0-ubuntu18.04-x86_64.tgz" in (err.value.hint or "")
    assert not list(cache.glob("*.part"))
