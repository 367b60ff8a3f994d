"""NVIDIA DeepLearningExamples MXNet RN50v1.5 at e470c21 run by horovod without benchmark.py (DLPerf).

Every horovod rank prints its own Speedometer line for each batch (``fit.py``: the global batch over that
rank's time since its last line), so a batch has as many lines as the run has ranks, one after another.
DLPerf's ``extract_mxnet_logs.py`` rounds each line's figure to 2 decimals and takes, per batch, the median
over the ranks; here those consecutive lines of one batch make one record, that median. The rest (runs,
facts) is :mod:`repro.measure.parsers.ngc_mxnet`'s. The lines are the same as that format's, so this
parser is named by a manifest, never detected.
"""

from __future__ import annotations

import re
from statistics import median

from repro.measure.parsers import PARSERS
from repro.measure.parsers.base import NUM, Builder, Rule
from repro.measure.parsers.ngc_mxnet import NgcMxnet

_SPEED = (rf"Epoch\[(?P<epoch>\d+)\] Batch \[\d+-(?P<iteration>\d+)\]\s+"
          rf"Speed: (?P<value>{NUM}) samples/sec")


@PARSERS.register("ngc-mxnet-ranks")
class NgcMxnetRanks(NgcMxnet):
    detect_any = ()
    rules = (*(r for r in NgcMxnet.rules if "Speed: " not in r.pattern), Rule(_SPEED, "on_speed"))

    def on_speed(self, b: Builder, m: re.Match[str], line: int) -> None:
        batch = (int(m.group("epoch")), int(m.group("iteration")))
        pending = b.scratch.get("batch")
        if pending is not None and pending[0] != batch:
            self._flush(b)
        held = b.scratch.setdefault("batch", (batch, [], line))
        held[1].append(round(float(m.group("value")), 2))  # type: ignore[index]

    @staticmethod
    def _flush(b: Builder) -> None:
        pending = b.scratch.pop("batch", None)
        if pending is not None:
            (epoch, iteration), values, line = pending
            b.record(median(values), iteration, epoch, line)

    def on_namespace(self, b: Builder, m: re.Match[str], line: int) -> None:
        self._flush(b)
        super().on_namespace(b, m, line)

    def finish(self, b: Builder) -> None:
        self._flush(b)
        super().finish(b)
