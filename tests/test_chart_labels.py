"""No two labels of a chart the kit draws run into each other, each kind of chart, with crowded inputs:
the report's chart of the bundled tables with the most cells (and with every cell marked by a verdict that
is not a match), the history chart of many cells with many runs from several clusters. Each text's box on
the drawn figure (matplotlib's Agg renderer), checked pairwise."""

from __future__ import annotations

import dataclasses
import itertools
import io
from typing import Any

import pytest

from repro.record.history import FIELDS, CellHistory
from repro.record.history_chart import history_figure
from repro.verdict.reproduce import reproduce_table, resolve_tables
from repro.verdict.rules import DEVIATES, INCONCLUSIVE, NOT_DERIVABLE, NOT_RUN, SLOWER

#: the bundled tables with the most cells (22: four frameworks, two precisions, 1 to 32 GPUs), and one of
#: five columns of four cells
CROWDED = ["perf-2.3-v100", "perf-2.5-v100", "tf-benchmarks-dgx1-p100-real"]


def clashes(fig: Any) -> list[tuple[str, str]]:
    """Every pair of visible, non-empty texts of the drawn figure whose boxes overlap."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks, drawn = set(), set()  # every tick label; those of a tick inside its axis's view (the ones drawn)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks |= {id(tick.label1), id(tick.label2)}
                if low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                    drawn |= {id(tick.label1), id(tick.label2)}
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and (t.axes is None or t.axes.get_visible()) and (id(t) not in ticks or id(t) in drawn)]
    boxes = [(t.get_text().replace("\n", " ")[:40], t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for (a, x), (b, y) in itertools.combinations(boxes, 2)
            if x.width and y.width and x.overlaps(y)]


def report_figure(results: list[Any]) -> Any:
    """The report's chart as drawn (``plot_report`` saves and closes it: the figure is kept here)."""
    import matplotlib.pyplot as plt

    from repro.verdict.chart import plot_report

    kept: list[Any] = []
    close = plt.close
    try:
        plt.close = lambda fig=None: kept.append(fig)  # type: ignore[assignment]
        plot_report(results, io.BytesIO())
    finally:
        plt.close = close
    return kept[0]


def marked(results: list[Any]) -> list[Any]:
    """The same tables with every cell given a verdict the chart writes above its bars and on its delta."""
    words = [SLOWER, INCONCLUSIVE, NOT_DERIVABLE, DEVIATES, NOT_RUN]
    out = []
    for r in results:
        cells = [dataclasses.replace(c, verdict=words[i % len(words)],
                                     reproduced=None if words[i % len(words)] in (NOT_RUN, NOT_DERIVABLE)
                                     else c.reproduced, delta_pct=None if i % 2 else c.delta_pct)
                 for i, c in enumerate(r.cells)]
        out.append(dataclasses.replace(r, cells=cells))
    return out


@pytest.mark.parametrize("table_id", CROWDED)
@pytest.mark.parametrize("verdicts", ["as derived", "marked"])
def test_no_two_labels_of_a_report_chart_overlap(table_id: str, verdicts: str) -> None:
    import matplotlib.pyplot as plt

    results = [reproduce_table(m, t) for m, t in resolve_tables([table_id])]
    fig = report_figure(marked(results) if verdicts == "marked" else results)
    try:
        assert clashes(fig) == []
    finally:
        plt.close(fig)


def _history(cell: str, gpus: int, runs: int, clusters: int) -> CellHistory:
    rows = []
    for i in range(runs):
        value = 370.0 * gpus * (1 - 0.002 * (i % 7))
        row = dict.fromkeys(FIELDS)
        row.update(run_no=i + 1, run_id=f"run{i}", started=f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}T09:00:00Z",
                   cluster=f"lab-{'abcdefghij'[i % clusters]}", value=value, low=value * 0.99,
                   high=value * 1.01, tolerance_pct=2.0)
        rows.append(tuple(row[f] for f in FIELDS))
    return CellHistory("perf-2.3-v100", "ngc-pytorch-rn50-v100", cell,
                       f"NGC PyTorch ResNet-50 v1.5, {gpus} GPU(s), FP32, batch 256 per GPU, a long title to wrap",
                       f"{370.194 * gpus:.2f}", "images/s", rows)


@pytest.mark.parametrize("cells,runs,clusters", [(1, 120, 3), (6, 60, 8), (7, 200, 10)])
def test_no_two_labels_of_a_history_chart_overlap(cells: int, runs: int, clusters: int) -> None:
    import matplotlib.pyplot as plt

    found = [_history(f"{2 ** i}n8g-fp32-bs256", 2 ** i, runs, clusters) for i in range(cells)]
    fig = history_figure(found, "ngc-pytorch-rn50-v100: each cell over time beside its published figure")
    try:
        assert clashes(fig) == []
    finally:
        plt.close(fig)
