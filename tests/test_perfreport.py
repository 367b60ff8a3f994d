"""The 2020 PerformanceReport comparison table at its exact commit (wanghuancoder/PerformanceReport@e15decee
``ResNet50V1.5/README.md``), re-derived from that commit's logs through the three targets that hold its columns."""

from __future__ import annotations

from cli_helpers import run_cli

from repro.verdict.reproduce import MATCH, NOT_PUBLISHED, reproduce_table, resolve_tables

#: ``repro report perfreport-e15decee-v100``, whole: every figure the table prints is re-derived from its log
#: (TF1 cut, not rounded, by the publisher; the PyTorch AMP cell reads the Summary's train.compute_ips, the
#: figure the publisher copied, by its own protocol)
REPORT = """\
# perfreport-e15decee-v100: Paddle ResNet50V1.5 performance test, comparison with other frameworks (the 2020 comparison
table, V100-SXM2-32GB)

Published in https://github.com/wanghuancoder/PerformanceReport @ e15decee4086 `ResNet50V1.5/README.md` (images/s).
Reproduced from: the publication's logs bundled with the kit.
Compared by re-derivation: each published figure from the publication's own log, exact at the published precision, or
not derivable with the reason.
Cells: 6 from the publication's logs (re-derivation).

Protocols (each manifest's measure):

- ngc-mxnet-rn50-v100-19.07: parser ngc-mxnet, protocol {aggregate: summary}
- ngc-pytorch-rn50-v100-20.07: parser ngc-pytorch, protocol {aggregate: summary}; cell 1 GPU (1 node) amp bs256:
  {aggregate: summary, summary_metric: train.compute_ips}
- ngc-tf1-rn50-v100-20.06: parser ngc-tf1, protocol {aggregate: summary}

Each cell: published → reproduced (delta) verdict.

| GPUs            | NGC MXNet fp32 bs128           | NGC MXNet fp16 bs256           |
|-----------------|--------------------------------|--------------------------------|
| 1 GPU (1 node)  | 376.18 → 376.180 (exact) match | 1398.8 → 1398.80 (exact) match |
| 8 GPUs (1 node) | — (not published)              | — (not published)              |

| GPUs            | NGC PyTorch fp32 bs128         | NGC PyTorch amp bs256          |
|-----------------|--------------------------------|--------------------------------|
| 1 GPU (1 node)  | 355.69 → 355.690 (exact) match | 797.38 → 797.380 (exact) match |
| 8 GPUs (1 node) | — (not published)              | — (not published)              |

| GPUs            | NGC TensorFlow 1.15 fp32 bs128   | NGC TensorFlow 1.15 amp bs256     |
|-----------------|----------------------------------|-----------------------------------|
| 1 GPU (1 node)  | 398.257 → 398.2573 (exact) match | 985.466 → 985.4669 (+0.00%) match |
| 8 GPUs (1 node) | — (not published)                | — (not published)                 |

Speedup over the base cell and scaling efficiency:

| GPUs           | NGC MXNet fp32 bs128   | NGC MXNet fp16 bs256   |
|----------------|------------------------|------------------------|
| 1 GPU (1 node) | x1.00 (100% of linear) | x1.00 (100% of linear) |

| GPUs           | NGC PyTorch fp32 bs128   | NGC PyTorch amp bs256   |
|----------------|--------------------------|-------------------------|
| 1 GPU (1 node) | x1.00 (100% of linear)   | x1.00 (100% of linear)  |

| GPUs           | NGC TensorFlow 1.15 fp32 bs128   | NGC TensorFlow 1.15 amp bs256   |
|----------------|----------------------------------|---------------------------------|
| 1 GPU (1 node) | x1.00 (100% of linear)           | x1.00 (100% of linear)          |

Notes:

- ngc-mxnet-rn50-v100-19.07 1 GPU fp16 bs256: log contradicts manifest: published as 'AMP' but the log says amp False,
  dtype float16
- ngc-mxnet-rn50-v100-19.07 8 GPUs fp32 bs128: not published: the table prints '-' here
- ngc-mxnet-rn50-v100-19.07 8 GPUs fp16 bs256: not published: the table prints '-' here
- ngc-pytorch-rn50-v100-20.07 8 GPUs fp32 bs128: not published: the table prints '-' here
- ngc-pytorch-rn50-v100-20.07 8 GPUs amp bs256: not published: the table prints '-' here
- ngc-tf1-rn50-v100-20.06 8 GPUs fp32 bs128: not published: the table prints '-' here
- ngc-tf1-rn50-v100-20.06 8 GPUs amp bs256: not published: the table prints '-' here

Verdict: 6 match, 6 not published of 12 cells.
"""


def test_repro_report_of_the_2020_comparison_table_is_exactly_this() -> None:
    proc = run_cli("report", "perfreport-e15decee-v100")
    assert proc.stdout == REPORT
    assert proc.returncode == 0


def test_every_printed_figure_of_the_2020_comparison_table_comes_from_its_log() -> None:
    results = [reproduce_table(m, t) for m, t in resolve_tables(["perfreport-e15decee-v100"])]
    got = {(r.manifest.id, c.gpus, c.precision): c for r in results for c in r.cells}
    printed = {k: (c.published, round(c.reproduced, 2)) for k, c in got.items() if c.published is not None}
    assert printed == {
        ("ngc-tf1-rn50-v100-20.06", 1, "fp32"): ("398.257", 398.26),
        ("ngc-tf1-rn50-v100-20.06", 1, "amp"): ("985.466", 985.47),
        ("ngc-pytorch-rn50-v100-20.07", 1, "fp32"): ("355.69", 355.69),
        ("ngc-pytorch-rn50-v100-20.07", 1, "amp"): ("797.38", 797.38),
        ("ngc-mxnet-rn50-v100-19.07", 1, "fp32"): ("376.18", 376.18),
        ("ngc-mxnet-rn50-v100-19.07", 1, "fp16"): ("1398.8", 1398.8),
    }
    assert all(c.kind == "re-derivation" and len(c.logs) == 1 for k, c in got.items() if k[1] == 1)
    assert [k for k, c in got.items() if c.verdict == MATCH] == list(printed)
    # the AMP cell reads the figure the publisher copied (the Summary's train.compute_ips), exactly
    assert got[("ngc-pytorch-rn50-v100-20.07", 1, "amp")].exact
    assert {c.verdict for k, c in got.items() if k[1] == 8} == {NOT_PUBLISHED}
    # the e15decee MXNet logs are the d53a112 blobs: the table reads that bundled set
    assert all("@d53a112/" in c.logs[0] for k, c in got.items() if k[0].startswith("ngc-mxnet") and c.logs)
    assert all("@e15dece/" in c.logs[0] for k, c in got.items() if not k[0].startswith("ngc-mxnet") and c.logs)
