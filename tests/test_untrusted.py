"""Telemetry, results-store rows and numbers from the command line, parsed as untrusted: a hostile run
directory or a tampered store gives a clear error (exit 2) or a bad sample skipped and counted, never a
traceback, within a bound of CPU time (tests/test_hostile_input.py's ``run_cli``)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_explain import ONE, plant_telemetry
from test_hostile_input import TIME_BOUND_S, run_cli
from test_verdicts import scaled_run

from repro.nodes.telemetry import parse_stream, summary

GPU_HEADER = "gpu timestamp, index, utilization.gpu [%], clocks.current.sm [MHz], clocks.max.sm [MHz]"
GPU_ROW = "gpu 2026/07/14 08:12:53.353, 0, 97 %, 1410 MHz, 1980 MHz"
DIGITS = "9" * 5000

# (case, lines of one node's telemetry file, how many of its samples are bad)
SAMPLES: list[tuple[str, list[str], int]] = [
    ("gpu-value-1.2.3", [GPU_HEADER, GPU_ROW.replace("97 %", "1.2.3 %"), GPU_ROW], 1),
    ("gpu-value-5000-digits", [GPU_HEADER, GPU_ROW.replace("1410", DIGITS), GPU_ROW], 1),
    ("loadavg-1.2.3", ["loadavg 1 1.2.3 0.5 0.5 1/12 5", "loadavg 2 0.5 0.5 0.5 1/12 5"], 1),
    ("loadavg-5000-digits", [f"loadavg 1 0.5 0.5 0.5 {DIGITS}/12 5", "loadavg 2 0.5 0.5 0.5 1/12 5"], 1),
    ("stat-5000-digits", [f"stat 1 cpu {DIGITS} 1 1 1 1 1 1 1", "stat 2 cpu 1 1 1 1 1 1 1 1"], 1),
    ("stat-superscript-digit", ["stat 1 cpu \u00b2 1 1 1 1 1 1 1", "stat 2 cpu 1 1 1 1 1 1 1 1"], 1),
    ("khz-5000-digits", [f"mhz 1 khz {DIGITS}", "mhz 2 khz 2400000"], 1),
    ("mhz-1.2.3", ["mhz 1 1.2.3", "mhz 2 2400.5"], 1),
]


@pytest.mark.parametrize("case,lines,bad", SAMPLES, ids=[c[0] for c in SAMPLES])
def test_a_bad_sample_is_skipped_and_counted(case: str, lines: list[str], bad: int) -> None:
    s = parse_stream("node0", lines)
    assert s.skipped == bad
    assert s.gpu or s.load or s.stat or s.mhz, "the good sample beside it is kept"


@pytest.fixture(scope="module")
def a_run(tmp_path_factory: pytest.TempPathFactory):
    return scaled_run(tmp_path_factory.mktemp("untrusted"), 0.97, 0.003, repeats=2)


def fresh(a_run, tmp_path: Path):
    from repro.run.rundir import RunDir

    dest = tmp_path / a_run.path.name
    shutil.copytree(a_run.path, dest)
    return RunDir.open(dest)


@pytest.mark.parametrize("case,lines,bad", SAMPLES, ids=[c[0] for c in SAMPLES])
def test_explain_and_history_import_of_bad_samples(a_run, tmp_path: Path, case: str, lines: list[str],
                                                   bad: int) -> None:
    run = fresh(a_run, tmp_path)
    plant_telemetry(run, ONE, lines)
    code, out, took = run_cli(["explain", str(run.path), ONE])
    assert code == 0 and took < TIME_BOUND_S, out
    assert f"telemetry: {2 * bad} bad sample line(s) skipped" in out, out
    code, out, took = run_cli(["history", "import", str(run.path), "--results", str(tmp_path / "r.sqlite")])
    assert code == 0 and "as run #1" in out and took < TIME_BOUND_S, out


def test_a_300_mb_line_is_skipped_without_reading_it_whole(a_run, tmp_path: Path) -> None:
    run = fresh(a_run, tmp_path)
    plant_telemetry(run, ONE, [GPU_HEADER, GPU_ROW])
    for d in sorted((run.path / "cells" / ONE).glob("r*")):
        with (d / "telemetry-node0.txt").open("a") as f:
            f.truncate(300 << 20)  # a sparse file: 300 MB of NUL bytes on one line
    code, out, took = run_cli(["explain", str(run.path), ONE])
    assert code == 0 and took < TIME_BOUND_S, out
    assert "bad sample line(s) skipped" in out
    got = summary(run.path, ONE)
    assert got is not None and got["gpu"]["samples"] == 2


SHAPES = [[1], {"node0": "x"}, {"node0": {"gpu": 5}}, {"node0": {"gpu": {"busy_samples": "x", "samples": 1}}},
          {"node0": {"cpu": {"samples": 1, "load1_max": "x"}}}, {"node0": {"gpu": {"reasons": [1]}}},
          {"node0": {"gpu": {"samples": 1, "busy_samples": 1, "other_processes": [1]}}}]


@pytest.mark.parametrize("doc", SHAPES, ids=[json.dumps(d) for d in SHAPES])
def test_a_wrongly_shaped_telemetry_json_is_read_from_the_samples(a_run, tmp_path: Path, doc: object) -> None:
    run = fresh(a_run, tmp_path)
    plant_telemetry(run, ONE, [GPU_HEADER, GPU_ROW])
    for d in sorted((run.path / "cells" / ONE).glob("r*")):
        (d / "telemetry.json").write_text(json.dumps(doc))
    code, out, took = run_cli(["explain", str(run.path), ONE])
    assert code == 0 and took < TIME_BOUND_S, out
    assert "telemetry: 2 telemetry.json file(s) of the wrong shape, read from the samples" in out, out
    code, out, took = run_cli(["history", "import", str(run.path), "--results", str(tmp_path / "r.sqlite")])
    assert code == 0 and "as run #1" in out, out


# ------------------------------------------------------------------ the results store and numbers given
@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results store holding one sealed run of the target (as `repro report RUN` records it)."""
    from test_provenance import make_run

    root = tmp_path_factory.mktemp("store")
    store = root / "results.sqlite"
    code, out, _ = run_cli(["report", str(make_run(root / "a").path), "--results", str(store)], bound=60)
    assert code == 0 and "as run #1" in out, out
    return store


def tampered(recorded: Path, tmp_path: Path, sql: str) -> Path:
    path = tmp_path / "results.sqlite"
    shutil.copy(recorded, path)
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return path


TAMPERED = [
    ("value-text", "UPDATE cells SET value = 'abc' WHERE rowid = 1", "column value"),
    ("low-text", "UPDATE cells SET low = 'x' WHERE rowid = 1", "column low"),
    ("n-text", "UPDATE cells SET n = 'x' WHERE rowid = 1", "column n"),
    ("repeats-not-json", "UPDATE cells SET repeats = 'not json' WHERE rowid = 1", "column repeats"),
    ("repeats-a-mapping", "UPDATE cells SET repeats = '{\"a\": 1}' WHERE rowid = 1", "column repeats"),
    ("repeats-deep", "UPDATE cells SET repeats = '" + "[" * 100_000 + "]" * 100_000 + "' WHERE rowid = 1",
     "column repeats"),
    ("telemetry-not-json", "UPDATE cells SET telemetry = '[1' WHERE rowid = 1", "column telemetry"),
    ("telemetry-a-list", "UPDATE cells SET telemetry = '[1]' WHERE rowid = 1", "column telemetry"),
    ("facts-not-json", "UPDATE runs SET facts = 'x'", "column facts"),
    ("facts-a-list", "UPDATE runs SET facts = '[1]'", "column facts"),
    ("started-blob", "UPDATE runs SET started = x'00'", "column started"),
    ("verdict-blob", "UPDATE cells SET verdict = x'00ff' WHERE rowid = 1", "column verdict"),
]


VERBS = {"history": ["history", "perf-2.5-v100"], "history-json": ["history", "perf-2.5-v100", "--format", "json"],
         "compare": ["compare", "1", "1"]}
JSON_COLUMNS = ("repeats", "telemetry", "facts")  # what compare reads, history does not


@pytest.mark.parametrize("case,sql,words,verb", [
    pytest.param(*c, v, id=f"{v}-{c[0]}") for c in TAMPERED for v in VERBS
    if v == "compare" or not c[0].startswith(JSON_COLUMNS)])
def test_a_tampered_store_row_is_a_clear_error(recorded: Path, tmp_path: Path, case: str, sql: str, words: str,
                                               verb: str) -> None:
    path = tampered(recorded, tmp_path, sql)
    code, out, took = run_cli([*VERBS[verb], "--results", str(path)])
    assert code == 2 and took < TIME_BOUND_S, out
    assert f"results store {path}: " in out and words in out and "tampered" in out, out


@pytest.mark.parametrize("args,words", [
    (["history", "perf-2.5-v100", "--last", str(10**30)], "--last"),
    (["history", "perf-2.5-v100", "--last", str(2**63)], "--last"),
    (["compare", str(10**30), "1"], str(10**30)),
    (["compare", "#" + "9" * 5000, "1"], "9999"),
    (["compare", "1", "\u0661"], "\u0661"),  # an Arabic-Indic one: a digit to str.isdigit, no run number
], ids=["last-10**30", "last-2**63", "compare-10**30", "compare-5000-digits", "compare-arabic-digit"])
def test_numbers_from_the_command_line_are_bounded(recorded: Path, args: list[str], words: str) -> None:
    code, out, took = run_cli([*args, "--results", str(recorded)])
    assert code == 2 and took < TIME_BOUND_S, out
    assert words in out, out


@pytest.mark.parametrize("verb", [["history", "perf-2.5-v100"], ["compare", "1", "2"], ["history", "import"]])
def test_a_store_path_that_loops_is_exit_2(recorded: Path, tmp_path: Path, verb: list[str]) -> None:
    from test_provenance import make_run

    loop = tmp_path / "loop.sqlite"
    os.symlink(loop, loop)
    args = [*verb, str(make_run(tmp_path / "run").path)] if verb[-1] == "import" else verb
    code, out, took = run_cli([*args, "--results", str(loop)], bound=60)
    assert code == 2, out
    assert f"results store {loop}: a symbolic link loop" in out, out


# ------------------------------------------------------------------ what plan shows, quoted as it is passed
@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_plan_quotes_a_steps_environment_as_it_is_passed(tmp_path: Path, runtime: str) -> None:
    import subprocess

    import yaml

    doc = yaml.safe_load((Path(__file__).parent / "data" / "good" / "minimal.yaml").read_text())
    doc["image"]["registry"]["digest"] = "sha256:" + "a" * 64
    env = {"FOO": "a\nrm -rf ~", "BAR": "x y $(id) 'q'", "PLAIN": "INFO"}
    doc["launch"]["env"] = env
    manifest = tmp_path / "m.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("schema_version: 1\ndefaults: {user: root, gpus: 8}\nnodes:\n  - {name: g1, address: 10.0.0.1}\n"
                     f"scheduler: {{kind: slurm, partition: debug, time: 15, container: {runtime}}}\n")
    code, out, _ = run_cli(["plan", str(manifest), "--hosts", str(hosts), "--cells",
                            "gpus_per_node=1,precision=fp32"])
    assert code == 0, out
    assert not any(ln.startswith("rm -rf") for ln in out.splitlines()), out
    prefix = "APPTAINERENV_" if runtime == "apptainer" else ""
    for line in out[out.index("  env "):out.index("  $ srun")].splitlines():  # each read back by bash
        name = line.removeprefix("  env ").partition("=")[0]
        got = subprocess.run(["bash", "-c", f"export {line.removeprefix('  env ')}; printf %s \"${name}\""],
                             capture_output=True, text=True, check=True).stdout
        assert got == env[name.removeprefix(prefix)], line
    assert "  env PLAIN=INFO\n" in out or f"  env {prefix}PLAIN=INFO\n" in out


@pytest.mark.parametrize("args,option", [
    (["plan", "torch-rn50-cpu", "--script", "--hosts", "tests/data/detach/hosts-cpu.yaml", "--repeats", str(10**30)],
     "--repeats"),
    (["up", "torch-rn50-cpu", "--repeats", str(10**30)], "--repeats"),
    (["parse", "README.md", "--gpus", str(10**30)], "--gpus"),
    (["parse", "README.md", "--jobs", str(10**30)], "--jobs"),
], ids=["plan-repeats", "up-repeats", "parse-gpus", "parse-jobs"])
def test_counts_from_the_command_line_are_bounded(args: list[str], option: str) -> None:
    code, out, took = run_cli(args)
    assert code == 2 and took < TIME_BOUND_S, out
    assert f"Invalid value for '{option}'" in out and "is not in the range" in out, out
