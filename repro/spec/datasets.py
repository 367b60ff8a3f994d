"""Dataset formats: what each benchmark reads, and a shell check that a directory is one.

A manifest names the format its workload reads (``dataset: {format: ...}``); a hosts file
maps formats to directories on the nodes (``data: {FORMAT: /path}``). Preflight runs the
format's check on every node inside its one probe script, so a wrong or half-copied dataset
is found before a long run starts, with the fix in the message.

The layouts follow the readers at the manifests' pinned commits: PaddleClas
``ImageNetDataset`` (``image_root`` + ``cls_label_path`` lines ``path label``), the NVIDIA
DeepLearningExamples PyTorch loaders (``<data>/train`` and ``<data>/val``, one folder per
class, both opened even with ``--training-only``), TensorFlow's ``<data_dir>/train-*`` shard
glob, and MXNet's ``train.rec``/``train.idx``/``val.rec``/``val.idx`` (RN50v1.5 benchmark.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    layout: str  # one line, for messages and the README
    fix: str  # how to make a directory of this format
    # POSIX sh with $P the directory: a summary (exit 0), what is wrong (exit 1), no directory (exit 2)
    check: str


_JPEG_LIST = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
L="$P/train_list.txt"
[ -f "$L" ] || { echo "no train_list.txt in $P"; exit 1; }
read -r f l < "$L" || { echo "train_list.txt is empty"; exit 1; }
case $l in ''|*[!0-9]*) echo "the first line of train_list.txt is not 'PATH LABEL': $f $l"; exit 1;; esac
[ -f "$P/$f" ] || { echo "train_list.txt names $f, which is not a file under $P"; exit 1; }
echo "train_list.txt: $(wc -l < "$L" | tr -d ' ') lines; its first image exists"
"""

_JPEG = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
out=""
for s in train val; do
  [ -d "$P/$s" ] || { echo "no $s/ folder in $P"; exit 1; }
  n=$(find "$P/$s/" -mindepth 1 -maxdepth 1 -type d | wc -l | tr -d ' ')
  [ "$n" -gt 0 ] || { echo "$s/ has no class folders"; exit 1; }
  img=$(find "$P/$s/" -mindepth 2 -maxdepth 2 -type f \( -iname '*.jpeg' -o -iname '*.jpg' \) | head -n 1)
  [ -n "$img" ] || { echo "no JPEG file in the class folders of $s/"; exit 1; }
  out="$out${out:+, }$s/: $n class folders"
done
echo "$out"
"""

_TFRECORD = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
N='[0-9][0-9][0-9][0-9][0-9]'
t=$(find "$P/" -mindepth 1 -maxdepth 1 -name "train-$N-of-$N" | wc -l | tr -d ' ')
[ "$t" -gt 0 ] || { echo "no train-NNNNN-of-NNNNN files in $P"; exit 1; }
v=$(find "$P/" -mindepth 1 -maxdepth 1 -name "validation-$N-of-$N" | wc -l | tr -d ' ')
echo "$t train shards, $v validation shards"
"""

_RECORDIO = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
for f in train.rec train.idx val.rec val.idx; do
  [ -s "$P/$f" ] || { echo "no $f in $P (or it is empty)"; exit 1; }
done
echo "train.rec, train.idx, val.rec, val.idx"
"""

def _count_files(pattern: str, missing: str, label: str) -> str:
    """A check that the folder holds files matching ``pattern`` and how many (one per format's layout)."""
    return (f'\n[ -d "$P" ] || {{ echo "no directory $P"; exit 2; }}\n'
            f"n=$(find \"$P/\" -mindepth 1 -maxdepth 1 -type f -name '{pattern}' | wc -l | tr -d ' ')\n"
            f'[ "$n" -gt 0 ] || {{ echo "no {missing} files in $P"; exit 1; }}\n'
            f'echo "$n {label} files"\n')


_OFRECORD_PARTS = _count_files("part-*", "part-N", "part")

_HDF5 = _count_files("*.hdf5", ".hdf5", "hdf5")

_BERT_TFRECORD = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
n=$(find "$P/wiki/" -mindepth 1 -maxdepth 1 -type f -name '*.tfrecord' 2>/dev/null | wc -l | tr -d ' ')
[ "$n" -gt 0 ] || { echo "no .tfrecord files in $P/wiki"; exit 1; }
[ -f "$P/uncased_L-12_H-768_A-12/bert_config.json" ] || {
  echo "no uncased_L-12_H-768_A-12/bert_config.json in $P"; exit 1; }
echo "wiki/: $n tfrecord files"
"""

_GZ = _count_files("*.gz", ".gz", "gz")

_TFRECORD_DALI = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
N='[0-9][0-9][0-9][0-9][0-9]'
for d in tfrecords dali_idx; do
  [ -d "$P/$d" ] || { echo "no $d/ folder in $P"; exit 1; }
done
t=$(find "$P/tfrecords/" -mindepth 1 -maxdepth 1 -name "train-$N-of-$N" | wc -l | tr -d ' ')
[ "$t" -gt 0 ] || { echo "no train-NNNNN-of-NNNNN files in $P/tfrecords"; exit 1; }
i=$(find "$P/dali_idx/" -mindepth 1 -maxdepth 1 -name "train-$N-of-$N" | wc -l | tr -d ' ')
[ "$i" -eq "$t" ] || { echo "$t train shards in tfrecords/ but $i indexes in dali_idx/"; exit 1; }
echo "$t train shards with as many DALI indexes"
"""

_OFRECORD = r"""
[ -d "$P" ] || { echo "no directory $P"; exit 2; }
[ -d "$P/train" ] || { echo "no train/ folder in $P"; exit 1; }
t=$(find "$P/train/" -mindepth 1 -maxdepth 1 -name 'part-[0-9][0-9][0-9][0-9][0-9]' | wc -l | tr -d ' ')
[ "$t" -gt 0 ] || { echo "no part-NNNNN files in $P/train"; exit 1; }
echo "train/: $t parts"
"""

FORMATS: dict[str, Format] = {
    "imagenet-jpeg-list": Format(
        "JPEG images under the directory and train_list.txt with one 'relative/path.JPEG label' "
        "line per image",
        "PaddleClas reads dataset/ILSVRC2012: put train/ (and val/) there with train_list.txt "
        "(and val_list.txt) whose lines are 'train/n01440764/n01440764_10026.JPEG 0'",
        _JPEG_LIST),
    "imagenet-jpeg": Format(
        "train/ and val/, each with one folder per class holding JPEG files",
        "unpack ILSVRC2012 train and val into train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (the validation "
        "tarball is flat: move its images into class folders, e.g. with the valprep.sh script)",
        _JPEG),
    "imagenet-tfrecord": Format(
        "TFRecord shards named train-00000-of-01024 ... (and validation-00000-of-00128 ...)",
        "convert ImageNet with the TensorFlow models' imagenet_to_gcs.py or build_imagenet_data.py, which "
        "write train-NNNNN-of-01024 and validation-NNNNN-of-00128",
        _TFRECORD),
    "imagenet-recordio": Format(
        "MXNet RecordIO: train.rec, train.idx, val.rec and val.idx",
        "pack ImageNet with MXNet's im2rec (DeepLearningExamples MxNet/Classification/RN50v1.5 "
        "scripts/prepare_imagenet.sh writes all four files)",
        _RECORDIO),
    "bert-ofrecord": Format(
        "OneFlow OFRecord parts part-0, part-1, ... of BERT pretraining samples (input_ids, input_mask, "
        "segment_ids, masked_lm_*, next_sentence_labels)",
        "make them from Wikipedia and BookCorpus with google-research BERT's create_pretraining_data.py "
        "(seq length 128, 20 predictions) and convert the TFRecords to OFRecord (OneFlow-Benchmark "
        "LanguageModeling/BERT/README.md links the steps and a one-part sample)",
        _OFRECORD_PARTS),
    "bert-hdf5": Format(
        "HDF5 files (*.hdf5) of BERT pretraining samples, sequence length 128 with 20 predictions",
        "make them with NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT "
        "data/create_datasets_from_start.sh (its folder hdf5_lower_case_1_seq_len_128_max_pred_20_..."
        "/wikicorpus_en)",
        _HDF5),
    "bert-tfrecord": Format(
        "wiki/*.tfrecord (BERT pretraining samples, sequence length 128 with 20 predictions) and "
        "uncased_L-12_H-768_A-12/bert_config.json (Google's BERT-base uncased)",
        "make the TFRecords with the TensorFlow models' official/nlp/data/create_pretraining_data.py "
        "(--max_seq_length 128 --max_predictions_per_seq 20, vocab uncased_L-12_H-768_A-12/vocab.txt) into "
        "wiki/, and unpack Google's uncased_L-12_H-768_A-12 beside it",
        _BERT_TFRECORD),
    "bert-paddle-text": Format(
        "gzip files (*.gz) of PaddleNLP BERT's text pretraining samples (token ids;sentence types;positions;"
        "next sentence label per line), as data/train/demo_wiki_train.gz",
        "make demo_wiki_train_50.gz with DLPerf's PaddlePaddle/bert/scripts/make_pretrain_data.sh in "
        "PaddlePaddle/models release/1.8 PaddleNLP/pretrain_language_models/BERT/data (50 copies of "
        "train/demo_wiki_train.gz) and put it alone in the directory",
        _GZ),
    "imagenet-tfrecord-dali": Format(
        "tfrecords/ with TFRecord shards train-00000-of-01024 ... and dali_idx/ with one DALI index "
        "per shard",
        "write the TFRecords into tfrecords/, then the indexes with DeepLearningExamples "
        "TensorFlow/Classification/ConvNets utils/dali_index.sh tfrecords dali_idx (tfrecord2idx per shard)",
        _TFRECORD_DALI),
    "imagenet-ofrecord": Format(
        "OneFlow OFRecord: train/ with part-00000 ... part-00255",
        "convert ImageNet with OneFlow-Benchmark Classification/cnns/tools (imagenet_ofrecord.py), which "
        "writes train/part-NNNNN (256 parts)",
        _OFRECORD),
}


#: The fix when the directory is not there at all.
MISSING_FIX = ("copy the dataset to that path on every node, or name where it is: `data: {{{fmt}: /path}}` "
               "in the hosts file")


def check_script(fmt: str, path: str) -> str:
    """The shell check of one format, run in a subshell; ``path`` enters it shell-quoted only."""
    return f"(P={shlex.quote(path.rstrip('/') or '/')}\n{FORMATS[fmt].check.strip()}\n)"
