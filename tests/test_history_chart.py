"""`repro history --plot`: one series a cluster, the tolerance band around the published figure, and no
label that runs into another (every text's box on the drawn PNG, checked pairwise).

Six log trees of NGC PyTorch V100 (1 and 8 GPUs, FP32), as tests/test_store.py makes them: three recorded
under cluster lab-a (x1.000, x0.995, x0.950) and three under lab-b (x0.990, x0.985, x0.980), a month apart.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_store import factors, log_tree

from repro.record.history import read
from repro.record.history_chart import clusters, history_figure
from repro.record.store import open_store

TARGET = "ngc-pytorch-rn50-v100"
PLAN = (("lab-a", 1.0, "2026-09-01"), ("lab-b", 0.99, "2026-09-15"), ("lab-a", 0.995, "2026-10-01"),
        ("lab-b", 0.985, "2026-10-15"), ("lab-a", 0.95, "2026-11-01"), ("lab-b", 0.98, "2026-11-15"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("chart")
    env = {**os.environ, "REPRO_RESULTS": str(root / "results.sqlite")}
    for i, (cluster, mean, day) in enumerate(PLAN, 1):
        tree = log_tree(root / f"run{i}", factors(mean, 0.003, i), day, ((1, "fp32"), (8, "fp32")))
        res = run_cli("report", TARGET, "--from-logs", tree, "--cluster", cluster, env=env)
        assert f"as run #{i}" in res.stderr, res.stderr
    return root, env


def histories(root: Path) -> list:
    store = open_store(root / "results.sqlite", create=False)
    try:
        return read(store, TARGET)
    finally:
        store.close()


def test_one_series_a_cluster_and_the_tolerance_band(recorded: tuple[Path, dict[str, str]]) -> None:
    found = histories(recorded[0])
    assert clusters(found) == ["lab-a", "lab-b"]
    fig = history_figure(found, "t")
    try:
        ax = fig.axes[0]
        lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        assert [len(lines[c].get_xdata()) for c in ("lab-a", "lab-b")] == [3, 3]  # never one line through both
        assert list(lines["lab-b"].get_ydata()) == sorted(lines["lab-b"].get_ydata(), reverse=True)
        band = next(p for p in ax.patches if p.get_label().startswith("tolerance band"))
        ys = [band.get_y(), band.get_y() + band.get_height()]  # axhspan: a Rectangle, y in data
        assert band.get_label() == "tolerance band: published ±2%"
        assert min(ys) == pytest.approx(370.194 * 0.98) and max(ys) == pytest.approx(370.194 * 1.02)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend[:2] == ["lab-a", "lab-b"] and "published figure" in legend
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def _boxes(fig) -> list[tuple[str, object]]:
    """Every visible text drawn on the figure with its box in pixels."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [("suptitle", fig._suptitle)] if fig._suptitle else []
    for legend in fig.legends:
        texts += [(f"legend {t.get_text()}", t) for t in legend.get_texts()]
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        texts += [(f"panel {i} title", ax.title), (f"panel {i} ylabel", ax.yaxis.label)]
        texts += [(f"panel {i} text", t) for t in ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            texts += [(f"panel {i} tick {t.get_text()}", t) for t in axis.get_ticklabels() if t.get_text()]
            texts.append((f"panel {i} offset", axis.get_offset_text()))
    return [(name, t.get_window_extent(renderer)) for name, t in texts if t.get_visible() and t.get_text()]


def test_no_label_runs_into_another_and_the_png_is_looked_at(recorded: tuple[Path, dict[str, str]],
                                                             tmp_path: Path) -> None:
    root, env = recorded
    fig = history_figure(histories(root), f"{TARGET}: each cell over time beside its published figure")
    try:
        boxes = _boxes(fig)
        clashes = [(a, b) for (a, x), (b, y) in itertools.combinations(boxes, 2)
                   if x.width and y.width and x.overlaps(y)]
        assert not clashes
        legend = fig.legends[0].get_window_extent()
        panels = [ax.get_tightbbox() for ax in fig.axes if ax.get_visible()]
        assert not [p for p in panels if p.overlaps(legend)]
        assert not fig._suptitle.get_window_extent().overlaps(legend)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    chart = tmp_path / "history.png"
    res = run_cli("history", TARGET, "--plot", chart, env=env)
    assert res.returncode == 0, res.stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
