"""Every pasted output of README.md and docs/ is the real output of its command (tests/docs_examples.py says
how a page marks one). The examples that can run offline run here, in this process, against scratch
folders made as the pages describe them; the others name what produces them (an integration test, a
package index, a timing), and that name is checked. `mkdocs build --strict` (links, the generated
references) runs in scripts/run-tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli
from docs_examples import (KINDS, ROOT, Example, apply_filter, examples, matches, normalise, pages, parse_command,
                           shape, shape_mismatch)
from test_explain import slow_run
from test_store import factors, log_tree
from test_userlogs import scaled_copy
from test_verdicts import scaled_run

from repro.spec.manifest import find_target

ALL = [e for p in pages() for e in examples(p)]
MARKED = [e for e in ALL if e.kind]
OFFLINE = [e for e in MARKED if e.kind == "offline"]


# ------------------------------------------------------------------ scratch folders, as the pages make them
def _mine(tmp: Path) -> dict[str, str]:
    """One log each under mine/rep1 .. mine/rep5: the NGC PyTorch V100 1-GPU FP32 log, scaled per repeat."""
    src = next(c.logs[0] for c in find_target("ngc-pytorch-rn50-v100").table().cells
               if c.gpus == 1 and c.precision == "fp32")
    for k, f in enumerate((0.996, 1.003, 0.999, 1.004, 0.998), 1):
        scaled_copy(src, tmp / "mine" / f"rep{k}" / "train.log", f)
    return {str(tmp): "/tmp/docs"}


def _as_shown(run: Path, tmp: Path, name: str) -> dict[str, str]:
    """The run moved to ``logs/NAME`` of the scratch folder, the page's relative path (the text wraps by it)."""
    (tmp / "logs").mkdir(exist_ok=True)
    run.rename(tmp / "logs" / name)
    return {str(tmp): "/tmp/docs"}


def _slower(tmp: Path) -> dict[str, str]:
    """A run 3% slower than published, five repeats with 0.3% noise (tests/test_verdicts.py)."""
    return _as_shown(scaled_run(tmp, 0.97, 0.003).path, tmp, "20261125T125730Z-ngc-pytorch-rn50-v100-cd8b1f")


def _explained(tmp: Path) -> dict[str, str]:
    """The slower run with two causes planted, as tests/test_explain.py plants them."""
    return _as_shown(slow_run(tmp).path, tmp, "20261126T030029Z-ngc-pytorch-rn50-v100-0ab9f1")


def _site(tmp: Path) -> dict[str, str]:
    """site.yaml: the hosts file the Slurm page shows (its block holding `sif_dir`)."""
    page = ROOT / "docs" / "howto" / "slurm-docker.md"
    block = next(e.body for e in examples(page) if "sif_dir: /shared/sif" in e.body and not e.kind)
    (tmp / "site.yaml").write_text(block + "\n")
    return {}


def _wide(tmp: Path) -> dict[str, str]:
    """torch-rn50-cpu-wide.yaml: torch-rn50-cpu with `nodes: [1, 2, 64]`."""
    doc = yaml.safe_load((ROOT / "manifests" / "torch-rn50-cpu.yaml").read_text())
    doc["matrix"]["nodes"] = [1, 2, 64]
    (tmp / "torch-rn50-cpu-wide.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return {}


def _store(tmp: Path) -> dict[str, str]:
    """Three trees of five repeats (1 and 8 GPUs, FP32 and AMP), mean 1.000, 0.995 and 0.950, 0.3% spread,
    dated 2026-09-01, 2026-10-01 and 2026-11-01, as tests/test_store.py makes them."""
    cells = ((1, "fp32"), (8, "fp32"), (1, "amp"), (8, "amp"))
    for i, (name, mean, day) in enumerate((("sep", 1.0, "2026-09-01"), ("oct", 0.995, "2026-10-01"),
                                           ("nov", 0.95, "2026-11-01")), 1):
        log_tree(tmp / name, factors(mean, 0.003, i), day, cells)
    return {str(tmp): "/tmp/store-demo"}


def _store_recorded(tmp: Path) -> dict[str, str]:
    """The three trees of ``_store``, recorded in that order (runs #1, #2, #3)."""
    paths = _store(tmp)
    env = {**os.environ, "REPRO_RESULTS": "results.sqlite"}
    for name in ("sep", "oct", "nov"):
        run_cli("report", "ngc-pytorch-rn50-v100", "--from-logs", name, "--cluster", "lab-v100", cwd=tmp, env=env)
    return paths


def _a100(tmp: Path) -> dict[str, str]:
    """A new run of paddle-rn50-a100 from the committed logs (every record x 0.993, 0.3% noise), and the same
    logs as a tree of your own under a100-logs/ (one folder a cell and repeat)."""
    paths = _as_shown(scaled_run(tmp, 0.993, 0.003, target="paddle-rn50-a100").path, tmp,
                      "20261206T023640Z-paddle-rn50-a100-dd8c36")
    for log in sorted((tmp / "logs").glob("*/cells/*/r*/0-node0.log")):
        dest = tmp / "a100-logs" / log.parent.parent.name / log.parent.name / "train.log"
        dest.parent.mkdir(parents=True)
        dest.write_bytes(log.read_bytes())
    return paths


def _frameworks(tmp: Path) -> dict[str, str]:
    """Runs of Paddle and NGC PyTorch on V100 from their committed logs (x1.00), and NGC PyTorch x0.95."""
    runs = (("paddle", "paddle-rn50-v100", 1.0, "20261201T090000Z-paddle-rn50-v100-5e1c2a"),
            ("pytorch", "ngc-pytorch-rn50-v100", 1.0, "20261202T090000Z-ngc-pytorch-rn50-v100-81d0b4"),
            ("slower", "ngc-pytorch-rn50-v100", 0.95, "20261203T090000Z-ngc-pytorch-rn50-v100-c47f19"))
    for name, target, factor, shown in runs:
        (tmp / name).mkdir()
        _as_shown(scaled_run(tmp / name, factor, 0.003, target=target).path, tmp, shown)
        when = datetime.strptime(shown[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        for p in (tmp / "logs" / shown).rglob("*"):  # a run without provenance ran when its state was written
            os.utime(p, (when, when))
    return {str(tmp): "/tmp/docs"}


SETUPS: dict[str, Callable[[Path], dict[str, str]]] = {
    "mine": _mine, "slower-run": _slower, "explained-run": _explained, "site-yaml": _site,
    "wide-manifest": _wide, "store-demo": _store,
    "store-demo-recorded": _store_recorded, "a100-run": _a100, "framework-runs": _frameworks,
}


def run_example(example: Example, tmp: Path) -> list[tuple[str, list[str], list[str]]]:
    """(command, expected lines, the lines it printed here) for each command of an offline example."""
    setup = example.arg or None
    paths = SETUPS[setup](tmp) if setup else {}
    env = {**os.environ, "REPRO_RESULTS": "results.sqlite", "COLUMNS": "120"}
    out = []
    for command, expected in example.steps():
        shell = parse_command(command)
        res = run_cli(*shell.argv, cwd=tmp if setup else ROOT, env=env)
        stdout = [] if shell.to_null else res.stdout.splitlines()
        for words in shell.filters:
            stdout = apply_filter(words, stdout)
        got = stdout + res.stderr.splitlines() + ([f"exit {res.returncode}"] if shell.echo_exit else [])
        got = normalise("\n".join(got), paths).splitlines()
        out.append((command, expected, got))
    return out


# ------------------------------------------------------------------ the pages
def test_every_command_block_is_marked_and_every_mark_is_known() -> None:
    unmarked = [e.name for e in ALL if not e.kind and e.body.startswith("$ ")]
    assert not unmarked, f"a block of commands and their output needs `<!-- example: KIND ... -->`: {unmarked}"
    assert {e.kind for e in MARKED} <= set(KINDS), {e.name: e.kind for e in MARKED if e.kind not in KINDS}
    assert not [e.name for e in OFFLINE if e.arg and e.arg not in SETUPS]
    for e in MARKED:
        if e.kind == "cluster":
            test, _, ident = e.arg.partition("#")
            assert (ROOT / test).is_file() and ident, f"{e.name}: give TEST.py#ID of an existing test: {e.arg}"
            assert f'assert_cluster_example("{ident}"' in (ROOT / test).read_text(), (
                f"{e.name}: {test} does not compare its output with #{ident}")
        elif e.kind in ("manual", "network", "measured"):
            assert e.arg, f"{e.name}: say what it needs"


def test_the_count_of_examples_is_known() -> None:
    """The count the pages hold; a new example is counted by its kind."""
    kinds = {k: sum(e.kind == k for e in MARKED) for k in KINDS}
    assert kinds["offline"] >= 10 and sum(kinds.values()) == len(MARKED)


@pytest.mark.parametrize("example", OFFLINE, ids=[e.name for e in OFFLINE])
def test_a_pasted_output_is_what_its_command_prints(example: Example, tmp_path: Path) -> None:
    for command, expected, got in run_example(example, tmp_path):
        assert matches(expected, got), (f"{example.name}: `{command}` prints\n" + "\n".join(got)
                                        + "\n\n--- the page says\n" + "\n".join(expected))


HOSTS_FILES = [e for e in ALL if not e.kind and e.body.startswith("schema_version: 1\n")]


@pytest.mark.parametrize("example", HOSTS_FILES, ids=[e.name for e in HOSTS_FILES])
def test_a_hosts_file_a_page_shows_is_valid(example: Example, tmp_path: Path) -> None:
    """The inventories the pages show are read by `repro validate` as `plan`, `up` and `preflight` read them."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(example.body + "\n")
    res = run_cli("validate", hosts)
    assert (res.returncode, res.stdout) == (0, f"ok {hosts} (hosts)\n"), (example.name, res.stdout, res.stderr)


# ------------------------------------------------------------------ the check itself
def test_an_edited_output_fails(tmp_path: Path) -> None:
    """One figure of the tutorial's first table changed, one line left out, one line added: each fails."""
    first = next(e for e in OFFLINE if "repro report perf-2.5-v100;" in e.body)
    (command, expected, got), = run_example(first, tmp_path)
    assert matches(expected, got)
    i = next(i for i, ln in enumerate(expected) if "389.54 → 389.538" in ln)
    edits = [expected[:i] + [expected[i].replace("389.538", "389.539")] + expected[i + 1:],
             expected[:i] + expected[i + 1:], expected[:i] + ["| 2 GPUs | x |"] + expected[i:]]
    assert not any(matches(edited, got) for edited in edits)


CLUSTER = [e for e in MARKED if e.kind == "cluster"]


@pytest.mark.parametrize("example", CLUSTER, ids=[e.name for e in CLUSTER])
def test_a_cluster_example_fails_its_test_when_a_line_is_edited(example: Example) -> None:
    """The block's own lines, with every time, digest, path and figure changed, pass; a word changed, a line
    left out of what was produced or two lines swapped fail (so the integration test catches an edited page)."""
    lines = [ln for ln in example.body.splitlines() if ln.strip() and not ln.startswith(("$ ", "..."))]
    assert len(lines) >= 2, example.name
    other = [re.sub(r"(?<![A-Za-z0-9])[0-9]+", lambda m: "7" * len(m[0]), ln).replace("/tmp/", "/var/tmp/") for ln in lines]
    assert shape_mismatch(lines, "\n".join(other)) is None
    words = next(i for i, ln in enumerate(lines) if re.search(r"[a-z]{4,}", shape(ln)))
    edited = lines[:words] + [re.sub(r"[a-z]{4,}", "xyzzy", lines[words], count=1)] + lines[words + 1:]
    assert shape_mismatch(edited, "\n".join(other)) is not None
    assert shape_mismatch(lines, "\n".join(other[:words] + other[words + 1:])) is not None
    first, second = next((i, j) for i in range(len(lines)) for j in range(i + 1, len(lines))
                         if shape(lines[i]) != shape(lines[j]))
    swapped = list(other)
    swapped[first], swapped[second] = swapped[second], swapped[first]
    assert shape_mismatch(lines, "\n".join(swapped)) is not None or len(set(map(shape, lines))) < len(lines)


def test_the_shape_keeps_words_and_drops_what_changes_between_runs() -> None:
    assert shape("03:41:28 info  image ready: rc-node1 imported (4.1.2)") == "<time> info image ready: rc-node<n> imported (<n>.<n>)"
    assert shape("job 13 (submitted 2026-11-26T06:38:15.136+00:00 from vm): COMPLETED") == \
        "job <n> (submitted <when> from <host>): COMPLETED"
    assert shape("run directory /tmp/r/20261125T150355Z-torch-rn50-cpu-ad070a") == "run directory <path>"
    assert shape("| 2 workers (2 nodes) |   1.90   |") == "| <n> workers (<n> nodes) | <n> |"


def test_the_matcher_leaves_out_only_what_a_page_marks() -> None:
    got = ["a", "b", "c", "a long line"]
    assert matches(["a", "...", "a long ..."], got) and matches(["...", "c", "a long line"], got)
    assert not matches(["a", "c", "a long line"], got) and not matches(["a", "...", "a short ..."], got)
    assert not matches(["a", "b", "c"], got) and not matches(["b", "..."], got)


def test_the_page_finder_sees_marks_and_indented_blocks(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    text = ("text\n\n<!-- example: cluster tests/x.py -->\n```\n$ repro a\nout\n```\n\n- item\n\n"
            "  <!-- example: offline -->\n  ```\n  $ repro b | head -2\n  x\n  ```\n\n```yaml\nk: v\n```\n")
    found = examples(page, text)
    assert [(e.kind, e.arg, e.body) for e in found] == [
        ("cluster", "tests/x.py", "$ repro a\nout"), ("offline", "", "$ repro b | head -2\nx"), (None, "", "k: v")]
    assert found[1].steps() == [("repro b | head -2", ["x"])]
    shell = parse_command('repro report X --fail-on slower >/dev/null; echo "exit $?"')
    assert (shell.argv, shell.to_null, shell.echo_exit) == (["report", "X", "--fail-on", "slower"], True, True)


# ------------------------------------------------------------------ the generated references
def test_the_schema_reference_has_a_row_for_every_field_of_every_schema() -> None:
    """docs/hooks/schema_reference.py (the MkDocs hook): each schema's top-level fields and a nested one."""
    spec = importlib.util.spec_from_file_location("schema_reference", ROOT / "docs" / "hooks" / "schema_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    for path in sorted((ROOT / "repro" / "spec" / "schemas").glob("*.json")):
        text = hook.reference(path.name)
        fields = json.loads(path.read_text())["properties"]
        assert all(f"| `{name}` |" in text for name in fields), path.name
    hosts = hook.reference("hosts.v1.json")
    assert "| `nodes[].address` | string | yes |" in hosts and "| `scheduler.sbatch_extra[]` | string |" in hosts
    page = hook.on_page_markdown("a\n<!-- schema: hosts.v1.json -->\nb")
    assert page.startswith("a\nGenerated from `repro/spec/schemas/hosts.v1.json`") and page.endswith("\nb")
    for name in ("manifest", "hosts", "provenance"):
        schema = (ROOT / "docs" / "reference" / f"{name}.md").read_text()
        assert f"<!-- schema: {name}.v1.json -->" in schema
    assert "::: mkdocs-click" in (ROOT / "docs" / "reference" / "cli.md").read_text()
