"""``repro history --plot``: each cell over time, one panel a cell (figures of 1 and 32 GPUs differ too much
to read on one axis): its line through the runs' figures, the interval of each run (95% Student-t interval
of the mean of its repeats) as a band around it, its published figure as a dashed reference line. Drawn with
matplotlib's non-interactive backend, text as plain text (as the report's chart:
:func:`repro.verdict.chart.plain_text`)."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from repro.record.history import CellHistory
from repro.verdict.chart import plain_text
from repro.verdict.rules import INTERVAL

LINE, PUBLISHED = "#2b6cb0", "#4a5568"


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def plot_history(histories: Sequence[CellHistory], path: Path | io.BytesIO, fmt: str = "png",
                 title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 1 if len(histories) == 1 else 2
    rows = math.ceil(len(histories) / cols)
    height = 1.0 + 3.0 * rows  # inches: the title and the legend above the panels, 3 per row of panels
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, height), dpi=130, squeeze=False, sharex=True)
    for ax, h in zip(axes.flat, histories):
        _draw_cell(ax, h)
    for ax in list(axes.flat)[len(histories):]:
        ax.set_visible(False)
    fig.suptitle(title or "Each cell over time beside its published figure", fontsize=11, y=1 - 0.05 / height)
    _legend(fig, axes[0][0], top=1 - 0.32 / height)
    plain_text(fig)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / height))
    try:
        fig.savefig(path, format=fmt, bbox_inches="tight")
    finally:
        plt.close(fig)


def _draw_cell(ax: Any, h: CellHistory) -> None:
    import matplotlib.dates as mdates

    runs = [r for r in map(h.run, h.runs) if r["value"] is not None]
    xs = [_when(r["started"]) for r in runs]
    if runs:
        ax.plot(xs, [r["value"] for r in runs], "o-", color=LINE, markersize=4, label="each run's figure")
        banded = [(x, r) for x, r in zip(xs, runs) if r["low"] is not None and r["high"] is not None]
        if banded:
            ax.fill_between([x for x, _ in banded], [r["low"] for _, r in banded],
                            [r["high"] for _, r in banded],
                            color=LINE, alpha=0.18, linewidth=0, label=f"band: {INTERVAL}")
    if h.published:
        ax.axhline(float(h.published), color=PUBLISHED, linestyle="--", linewidth=1.2,
                   label="published figure")
    else:
        ax.text(0.5, 0.92, "no published figure", transform=ax.transAxes, ha="center", fontsize=8)
    name = f"{h.table}: {h.title}" if h.table else h.title
    ax.set_title("\n".join(textwrap.wrap(name, 72)), fontsize=9)
    ax.set_ylabel(h.unit or "images/s", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.tick_params(labelsize=7)


def _legend(fig: Any, ax: Any, top: float) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, top))
