"""Dataset formats: which format each target reads, the synthetic-data variants the manifests
declare, and the shell checks run on real small trees made here, under every POSIX shell
on this machine (a node's login shell runs them).

The layouts come from the readers at the pinned commits (see repro/spec/datasets.py), not from
the kit's own output.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from repro.spec import datasets
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target, manifest_files, synthetic
from repro.nodes.preflight import dataset_probe, dataset_section
from repro.nodes.facts import parse_sections

REPO = Path(__file__).resolve().parents[1]
SHELLS = [s for s in ("dash", "bash", "zsh", "ksh", "busybox") if shutil.which(s)]

#: What each shipped target reads (PaddleClas: image_root + train_list.txt; DLE PyTorch: train/ and val/
#: class folders; DLE TF1, TF2 models, tf_cnn_benchmarks: train-* TFRecord shards; DLE MXNet: .rec/.idx).
FORMATS = {
    "dlperf-ngc-pytorch-rn50-v100": "imagenet-jpeg",
    "dlperf-ngc-pytorch-rn50-v100-static": "imagenet-jpeg",
    "dlperf-tf2-rn50-v100": "imagenet-tfrecord",
    "dlperf-pytorch-rn50-v100": "imagenet-jpeg",
    "dlperf-pytorch-rn50-v100-w8": "imagenet-jpeg",
    "dlperf-paddle-rn50-v100": "imagenet-jpeg-list",
    "dlperf-paddle-rn50-v100-static": "imagenet-jpeg-list",
    "ngc-mxnet-rn50-a100": "imagenet-recordio",
    "ngc-mxnet-rn50-v100": "imagenet-recordio",
    "ngc-mxnet-rn50-v100-19.07": "imagenet-recordio",
    "ngc-mxnet-rn50-v100-2.3": "imagenet-recordio",
    "ngc-pytorch-rn50-a100": "imagenet-jpeg",
    "ngc-pytorch-rn50-v100": "imagenet-jpeg",
    "ngc-pytorch-rn50-v100-20.07": "imagenet-jpeg",
    "ngc-pytorch-rn50-v100-2.3": "imagenet-jpeg",
    "ngc-tf1-rn50-a100": "imagenet-tfrecord",
    "ngc-tf1-rn50-v100": "imagenet-tfrecord",
    "ngc-tf1-rn50-v100-20.06": "imagenet-tfrecord",
    "ngc-tf1-rn50-v100-2.3": "imagenet-tfrecord",
    "paddle-rn50-a100": "imagenet-jpeg-list",
    "paddle-rn50-v100": "imagenet-jpeg-list",
    "paddle-rn50-v100-2.3": "imagenet-jpeg-list",
    "tf-cnn-rn50-p100-real": "imagenet-tfrecord",
    "tf-cnn-alexnet-k80-ec2-real": "imagenet-tfrecord",
    "tf-cnn-inception3-k80-ec2-real": "imagenet-tfrecord",
    "tf-cnn-rn152-k80-ec2-real": "imagenet-tfrecord",
    "tf-cnn-rn50-k80-ec2-real": "imagenet-tfrecord",
    "tf-cnn-vgg16-k80-ec2-real": "imagenet-tfrecord",
    "tf-cnn-alexnet-k80-gce-real": "imagenet-tfrecord",
    "tf-cnn-inception3-k80-gce-real": "imagenet-tfrecord",
    "tf-cnn-rn152-k80-gce-real": "imagenet-tfrecord",
    "tf-cnn-rn50-k80-gce-real": "imagenet-tfrecord",
    "tf-cnn-vgg16-k80-gce-real": "imagenet-tfrecord",
    "tf-cnn-alexnet-p100-real": "imagenet-tfrecord",
    "tf-cnn-inception3-k80-ec2-real-bs32": "imagenet-tfrecord",
    "tf-cnn-inception3-k80-gce-real-bs32": "imagenet-tfrecord",
    "tf-cnn-inception3-p100-real-bs32": "imagenet-tfrecord",
    "tf-cnn-inception3-p100-real": "imagenet-tfrecord",
    "tf-cnn-rn152-p100-real-bs32": "imagenet-tfrecord",
    "tf-cnn-rn152-p100-real": "imagenet-tfrecord",
    "tf-cnn-rn50-k80-ec2-real-bs32": "imagenet-tfrecord",
    "tf-cnn-rn50-k80-gce-real-bs32": "imagenet-tfrecord",
    "tf-cnn-rn50-p100-real-bs32": "imagenet-tfrecord",
    "tf-cnn-vgg16-p100-real-bs32": "imagenet-tfrecord",
    "tf-cnn-vgg16-p100-real": "imagenet-tfrecord",
    "dlperf-oneflow-bert-v100": "bert-ofrecord",
    "dlperf-oneflow-bert-noclip-v100": "bert-ofrecord",
    "dlperf-ngc-pytorch-bert-v100": "bert-hdf5",
    "dlperf-tf2-bert-v100": "bert-tfrecord",
    "dlperf-paddle-bert-v100": "bert-paddle-text",
    "dlperf-ngc-tf1-rn50-v100": "imagenet-tfrecord-dali",
    "dlperf-ngc-tf1-rn50-v100-xla": "imagenet-tfrecord-dali",
    "dlperf-oneflow-rn50-v100": "imagenet-ofrecord",
    "dlperf-ngc-mxnet-rn50-v100": "imagenet-recordio",
    "dlperf-mxnet-gluoncv-rn50-v100": "imagenet-recordio",
    "mpi-rn50-cpu": None, "paddle-rn50-cpu": None, "torch-rn50-cpu": None, "tf-cnn-rn50-p100-synthetic": None,
    "tf-cnn-ps-cpu": None,
    "tf-cnn-alexnet-p100-synthetic": None,
    "tf-cnn-inception3-k80-ec2-synthetic-bs32": None,
    "tf-cnn-inception3-k80-gce-synthetic-bs32": None,
    "tf-cnn-inception3-p100-synthetic-bs32": None,
    "tf-cnn-inception3-p100-synthetic": None,
    "tf-cnn-rn152-p100-synthetic-bs32": None,
    "tf-cnn-rn152-p100-synthetic": None,
    "tf-cnn-rn50-k80-ec2-synthetic-bs32": None,
    "tf-cnn-rn50-k80-gce-synthetic-bs32": None,
    "tf-cnn-rn50-p100-synthetic-bs32": None,
    "tf-cnn-vgg16-p100-synthetic-bs32": None,
    "tf-cnn-vgg16-p100-synthetic": None,
    "tf-cnn-inception3-k80-ec2-dist-synthetic-bs32": None, "tf-cnn-rn50-k80-ec2-dist-synthetic-bs32": None,
    "tf-cnn-alexnet-k80-ec2-synthetic": None, "tf-cnn-inception3-k80-ec2-synthetic": None, "tf-cnn-rn152-k80-ec2-synthetic": None, "tf-cnn-rn50-k80-ec2-synthetic": None, "tf-cnn-vgg16-k80-ec2-synthetic": None, "tf-cnn-alexnet-k80-gce-synthetic": None, "tf-cnn-inception3-k80-gce-synthetic": None, "tf-cnn-rn152-k80-gce-synthetic": None, "tf-cnn-rn50-k80-gce-synthetic": None, "tf-cnn-vgg16-k80-gce-synthetic": None, "tf-cnn-inception3-k80-ec2-dist-synthetic": None, "tf-cnn-rn152-k80-ec2-dist-synthetic": None, "tf-cnn-rn50-k80-ec2-dist-synthetic": None,
}


def test_every_target_names_the_format_it_reads() -> None:
    assert {f.stem: find_target(str(f)).dataset_format for f in manifest_files()} == FORMATS


def test_the_schemas_know_the_same_formats_as_the_checks() -> None:
    manifest = json.loads((REPO / "repro/spec/schemas/manifest.v1.json").read_text())
    hosts = json.loads((REPO / "repro/spec/schemas/hosts.v1.json").read_text())
    assert manifest["$defs"]["dataset_format"]["enum"] == list(datasets.FORMATS)
    assert hosts["properties"]["data"]["else"]["propertyNames"]["enum"] == list(datasets.FORMATS)


# --- --synthetic: declared per target, applied exactly as declared ----------------------------------------

#: The token runs each variant changes: DLE PyTorch's --data-backend (spelled "syntetic" before fc9c09b),
#: DLE TF1 without --data_dir in training_benchmark mode, DLE MXNet's --data-backend passed on by benchmark.py.
SYNTHETIC = {
    "dlperf-ngc-pytorch-rn50-v100": (["--data-backend", "dali-cpu"], ["--data-backend", "syntetic"]),
    "dlperf-ngc-pytorch-rn50-v100-static": (["--data-backend", "dali-cpu"], ["--data-backend", "syntetic"]),
    "ngc-pytorch-rn50-v100": (["/imagenet"], ["--data-backend", "synthetic", "/imagenet"]),
    "ngc-pytorch-rn50-a100": (["/imagenet"], ["--data-backend", "synthetic", "/imagenet"]),
    "ngc-pytorch-rn50-v100-20.07": (["/imagenet"], ["--data-backend", "syntetic", "/imagenet"]),
    "ngc-pytorch-rn50-v100-2.3": (["/imagenet"], ["--data-backend", "syntetic", "/imagenet"]),
    "ngc-tf1-rn50-v100": (["--data_dir=/data/tfrecords/"], []),
    "ngc-tf1-rn50-a100": (["--data_dir=/data/tfrecords/"], []),
    "ngc-tf1-rn50-v100-20.06": (["--data_dir=/data/tfrecords/"], []),
    "ngc-tf1-rn50-v100-2.3": (["--data_dir=/data/tfrecords/"], []),
    "ngc-mxnet-rn50-v100": (["--mode", "train"], ["--mode", "train", "--data-backend", "synthetic"]),
    "ngc-mxnet-rn50-a100": (["--mode", "train"], ["--mode", "train", "--data-backend", "synthetic"]),
    "ngc-mxnet-rn50-v100-19.07": (["--mode", "train"], ["--mode", "train", "--data-backend", "synthetic"]),
    "ngc-mxnet-rn50-v100-2.3": (["--mode", "train"], ["--mode", "train", "--data-backend", "synthetic"]),
}


def test_targets_declaring_synthetic_data() -> None:
    declared = {f.stem for f in manifest_files() if (find_target(str(f)).dataset or {}).get("synthetic")}
    assert declared == set(SYNTHETIC)


@pytest.mark.parametrize("target", sorted(SYNTHETIC))
def test_synthetic_variant(target: str) -> None:
    m = find_target(target)
    v = synthetic(m)
    old, new = SYNTHETIC[target]
    cmd, out = list(m.launch.command), list(v.launch.command)
    i = next(i for i in range(len(cmd)) if cmd[i:i + len(old)] == old)
    assert out == cmd[:i] + new + cmd[i + len(old):]
    assert [mt["source"] for mt in v.launch.container.get("mounts", [])] == []
    assert v.dataset_format is None and "dataset" not in v.data
    assert v.synthetic_data == v.notes[0] == v.data["notes"][0]
    assert v.notes[0].startswith(f"Synthetic data (--synthetic), not the publication's {m.dataset_format}: ")
    assert (v.id, v.image, v.matrix) == (m.id, m.image, m.matrix)
    assert v.sha256 != m.sha256


# --- hosts: one path for every format, or one per format ---------------------------------------------------

def test_one_data_path_serves_every_format_and_a_map_only_its_own(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("schema_version: 1\ndata: /datasets/imagenet\nnodes:\n  - {address: 10.0.0.1}\n")
    many = tmp_path / "many.yaml"
    many.write_text("schema_version: 1\ndata: {imagenet-jpeg: /srv/jpeg, imagenet-recordio: /srv/rec}\n"
                    "nodes:\n  - {address: 10.0.0.1}\n")
    assert [load_hosts(one).data_dir(f) for f in datasets.FORMATS] == ["/datasets/imagenet"] * len(datasets.FORMATS)
    assert {f: load_hosts(many).data_dir(f) for f in datasets.FORMATS} == {
        f: {"imagenet-jpeg": "/srv/jpeg", "imagenet-recordio": "/srv/rec"}.get(f) for f in datasets.FORMATS}


# --- the checks, on real trees --------------------------------------------------------------------------

def touch(root: Path, *names: str, data: bytes = b"x") -> None:
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(data)


def jpeg_list(root: Path) -> Path:
    touch(root, "train/n01440764/n01440764_10026.JPEG", "train/n01443537/n01443537_1.JPEG")
    (root / "train_list.txt").write_text("train/n01440764/n01440764_10026.JPEG 0\ntrain/n01443537/n01443537_1.JPEG 1\n")
    return root


def jpeg(root: Path) -> Path:
    touch(root, "train/n01440764/a.JPEG", "train/n01443537/b.jpeg", "train/n01484850/c.JPEG",
          "val/n01440764/ILSVRC2012_val_00000293.JPEG", "val/n01443537/ILSVRC2012_val_00000236.JPEG")
    return root


def tfrecord(root: Path) -> Path:
    touch(root, *[f"train-{i:05d}-of-01024" for i in range(3)], "validation-00000-of-00128")
    return root


def recordio(root: Path) -> Path:
    touch(root, "train.rec", "train.idx", "val.rec", "val.idx")
    return root


def ofrecord_parts(root: Path) -> Path:
    touch(root, "part-0", "part-1")
    return root


def hdf5_files(root: Path) -> Path:
    touch(root, "wikicorpus_en_training_0.hdf5")
    return root


def bert_tfrecord(root: Path) -> Path:
    touch(root, "wiki/wiki_AA.tfrecord", "uncased_L-12_H-768_A-12/bert_config.json")
    return root


def paddle_text(root: Path) -> Path:
    touch(root, "demo_wiki_train_50.gz")
    return root


def tfrecord_dali(root: Path) -> Path:
    shards = [f"train-{i:05d}-of-01024" for i in range(2)]
    touch(root, *[f"tfrecords/{n}" for n in shards], *[f"dali_idx/{n}" for n in shards])
    return root


def ofrecord(root: Path) -> Path:
    touch(root, *[f"train/part-{i:05d}" for i in range(4)])
    return root


def run_check(shell: str, fmt: str, path: Path) -> tuple[int, str]:
    argv = [shell, "sh"] if shell == "busybox" else [shell]
    done = subprocess.run([*argv, "-c", datasets.check_script(fmt, str(path))], capture_output=True, text=True,
                          timeout=30)
    assert done.stderr == ""
    return done.returncode, done.stdout


GOOD = [
    ("imagenet-jpeg-list", jpeg_list, "train_list.txt: 2 lines; its first image exists\n"),
    ("imagenet-jpeg", jpeg, "train/: 3 class folders, val/: 2 class folders\n"),
    ("imagenet-tfrecord", tfrecord, "3 train shards, 1 validation shards\n"),
    ("imagenet-recordio", recordio, "train.rec, train.idx, val.rec, val.idx\n"),
    ("bert-ofrecord", ofrecord_parts, "2 part files\n"),
    ("bert-hdf5", hdf5_files, "1 hdf5 files\n"),
    ("bert-tfrecord", bert_tfrecord, "wiki/: 1 tfrecord files\n"),
    ("bert-paddle-text", paddle_text, "1 gz files\n"),
    ("imagenet-tfrecord-dali", tfrecord_dali, "2 train shards with as many DALI indexes\n"),
    ("imagenet-ofrecord", ofrecord, "train/: 4 parts\n"),
]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("fmt", "make", "summary"), GOOD)
def test_a_good_tree_passes(shell: str, fmt: str, make, summary: str, tmp_path: Path) -> None:  # noqa: ANN001
    root = make(tmp_path / "data set")  # a space in the path stays one word
    assert run_check(shell, fmt, root) == (0, summary)


def _break(fmt: str, root: Path) -> None:
    """Each format's characteristic mistake."""
    if fmt == "imagenet-jpeg-list":
        (root / "train_list.txt").write_text("train/n01440764/missing.JPEG 0\n")
    elif fmt == "imagenet-jpeg":
        shutil.rmtree(root / "val")
        touch(root, "val/ILSVRC2012_val_00000001.JPEG")  # the validation tarball as unpacked: flat
    elif fmt == "imagenet-tfrecord":
        for f in root.glob("train-*"):
            f.rename(root / f"{f.name}.tfrecord")
    elif fmt == "bert-hdf5":
        for f in root.glob("*.hdf5"):
            f.rename(f.with_suffix(".h5"))  # not the suffix DLE's pretraining reads
    elif fmt == "bert-tfrecord":  # the records without the model's configuration beside them
        (root / "uncased_L-12_H-768_A-12" / "bert_config.json").unlink()
    elif fmt == "bert-paddle-text":  # unpacked, as make_pretrain_data.sh leaves it before its last gzip
        for f in root.glob("*.gz"):
            f.rename(f.with_suffix(""))
    elif fmt == "bert-ofrecord":
        for f in root.glob("part-*"):
            f.rename(root / f"shard{f.name[4:]}")  # named otherwise than OneFlow's reader opens
    elif fmt == "imagenet-tfrecord-dali":  # an index not made for one of the shards
        (root / "dali_idx" / "train-00001-of-01024").unlink()
    elif fmt == "imagenet-ofrecord":  # shards of another format where the parts should be
        for f in (root / "train").glob("part-*"):
            f.rename(root / "train" / f"{f.name}.tfrecord")
    else:
        (root / "train.idx").unlink()


BROKEN = [
    ("imagenet-jpeg-list", jpeg_list, "train_list.txt names train/n01440764/missing.JPEG, which is not a file under {root}"),
    ("imagenet-jpeg", jpeg, "val/ has no class folders"),
    ("imagenet-tfrecord", tfrecord, "no train-NNNNN-of-NNNNN files in {root}"),
    ("imagenet-recordio", recordio, "no train.idx in {root} (or it is empty)"),
    ("bert-ofrecord", ofrecord_parts, "no part-N files in {root}"),
    ("bert-hdf5", hdf5_files, "no .hdf5 files in {root}"),
    ("bert-paddle-text", paddle_text, "no .gz files in {root}"),
    ("bert-tfrecord", bert_tfrecord, "no uncased_L-12_H-768_A-12/bert_config.json in {root}"),
    ("imagenet-tfrecord-dali", tfrecord_dali, "2 train shards in tfrecords/ but 1 indexes in dali_idx/"),
    ("imagenet-ofrecord", ofrecord, "no part-NNNNN files in {root}/train"),
]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("fmt", "make", "message"), BROKEN)
def test_a_broken_tree_says_what_is_wrong(shell: str, fmt: str, make, message: str, tmp_path: Path) -> None:  # noqa: ANN001
    root = make(tmp_path / "ds")
    _break(fmt, root)
    assert run_check(shell, fmt, root) == (1, message.format(root=root) + "\n")


@pytest.mark.parametrize("fmt", list(datasets.FORMATS))
def test_a_missing_directory(fmt: str, tmp_path: Path) -> None:
    assert run_check("sh", fmt, tmp_path / "nothere") == (2, f"no directory {tmp_path / 'nothere'}\n")


@pytest.mark.parametrize(("lines", "message"), [
    ("", "train_list.txt is empty"),
    ("train/n01440764/n01440764_10026.JPEG\n", "the first line of train_list.txt is not 'PATH LABEL': "
                                                "train/n01440764/n01440764_10026.JPEG "),
    ("train/n01440764/n01440764_10026.JPEG zero\n", "the first line of train_list.txt is not 'PATH LABEL': "
                                                     "train/n01440764/n01440764_10026.JPEG zero"),
])
def test_a_bad_list_file(lines: str, message: str, tmp_path: Path) -> None:
    root = jpeg_list(tmp_path / "ds")
    (root / "train_list.txt").write_text(lines)
    assert run_check("sh", "imagenet-jpeg-list", root) == (1, message + "\n")


def test_no_list_file_and_no_jpeg_in_the_class_folders(tmp_path: Path) -> None:
    root = jpeg_list(tmp_path / "list")
    (root / "train_list.txt").unlink()
    assert run_check("sh", "imagenet-jpeg-list", root) == (1, f"no train_list.txt in {root}\n")
    root = jpeg(tmp_path / "jpeg")
    for f in (root / "train").rglob("*.*"):
        f.unlink()
    assert run_check("sh", "imagenet-jpeg", root) == (1, "no JPEG file in the class folders of train/\n")


def test_a_path_with_shell_metacharacters_is_only_a_path(tmp_path: Path) -> None:
    evil = tmp_path / "$(touch pwned); `touch pwned2` 'q'"
    root = tfrecord(evil)
    assert run_check("sh", "imagenet-tfrecord", root) == (0, "3 train shards, 1 validation shards\n")
    assert not (Path.cwd() / "pwned").exists() and not (Path.cwd() / "pwned2").exists()


# --- the probe section and its reading ----------------------------------------------------------------------

def probe(dataset: tuple[str, str]) -> dict[str, tuple[str, int]]:
    """The dataset section as preflight runs it: inside the probe script's section markers."""
    head = "s() { printf '\\n@@repro:%s\\n' \"$1\"; }; e() { printf '\\n@@repro-rc:%s\\n' \"$?\"; }\n"
    done = subprocess.run(["sh", "-c", head + dataset_section(dataset)], capture_output=True, text=True, timeout=30)
    return parse_sections(done.stdout)


def test_the_probe_reports_a_summary_or_the_problem_with_its_fix(tmp_path: Path) -> None:
    good = str(recordio(tmp_path / "rec"))
    p = dataset_probe(probe(("imagenet-recordio", good)), ("imagenet-recordio", good))
    assert (p.value, p.reason, p.detail) == ("train.rec, train.idx, val.rec, val.idx", None,
                                             f"imagenet-recordio at {good}")
    bad = str(recordio(tmp_path / "jpeg-not-rec"))
    p = dataset_probe(probe(("imagenet-jpeg", bad)), ("imagenet-jpeg", bad))
    assert p.value is None
    assert p.reason == (f"dataset imagenet-jpeg at {bad}: no train/ folder in {bad}; fix: unpack ILSVRC2012 train "
                        "and val into train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (the validation tarball is flat: "
                        "move its images into class folders, e.g. with the valprep.sh script)")
    gone = str(tmp_path / "gone")
    p = dataset_probe(probe(("imagenet-tfrecord", gone)), ("imagenet-tfrecord", gone))
    assert p.reason == (f"dataset imagenet-tfrecord at {gone}: no directory {gone}; fix: copy the dataset to that "
                        "path on every node, or name where it is: `data: {imagenet-tfrecord: /path}` in the hosts file")


# --- repro up: the synthetic variant when asked, and the dataset directory required ------------------------

def test_up_runs_the_declared_synthetic_variant_only_when_asked() -> None:
    from repro.up import UpOptions
    from repro.up.attached import manifest_and_hosts

    real, _, _ = manifest_and_hosts("ngc-tf1-rn50-v100", UpOptions())
    fake, _, _ = manifest_and_hosts("ngc-tf1-rn50-v100", UpOptions(synthetic=True))
    assert "--data_dir=/data/tfrecords/" in real.launch.command and real.synthetic_data is None
    assert "--data_dir=/data/tfrecords/" not in fake.launch.command and fake.synthetic_data


def test_up_needs_a_directory_for_the_targets_format(tmp_path: Path) -> None:
    from repro.errors import InputError
    from repro.spec.hosts import local_hosts
    from repro.nodes.preflight import dataset_to_check

    m = find_target("paddle-rn50-v100")
    with pytest.raises(InputError) as e:
        dataset_to_check(m, local_hosts())
    assert str(e.value) == ("the local machine (no --hosts file): data: paddle-rn50-v100 reads dataset format "
                            "imagenet-jpeg-list, and the inventory names no directory for it")
    assert e.value.hint == ("add `data: {imagenet-jpeg-list: /path/on/every/node}` to the hosts file and give it "
                            "with --hosts FILE")
    assert dataset_to_check(m, local_hosts(), required=False) is None
    assert dataset_to_check(find_target("torch-rn50-cpu"), local_hosts()) is None
