"""What the kit writes is safe for whoever reads it, whatever the manifest, inventory, logs or
command line held (issue #24): links, spreadsheet cells, XML, terminal escapes, chart titles,
secrets of every common shape, and input too deep or too large to print. Each case runs the
real CLI on a real manifest and real published logs."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from repro.record import provenance
from repro.record.archive import create
from repro.record.audit import OK, _manifest_check
from repro.cli import cli
from repro.events import Event
from repro.spec.hosts import load_hosts
from repro.spec.manifest import find_target, load_manifest
from repro.progress import PlainProgress
from repro.redact import REDACTED, redact_argv, redact_env, redact_text, strip_control
from repro.verdict.report import FORMULA_START
from repro.run.rundir import RunDir

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
MINIMAL = yaml.safe_load((DATA / "good" / "minimal.yaml").read_text())
TERMINAL_ATTACK = "\x1b]0;owned\x07\x1b[2J\x1b[1;1H\x9b31m\u202e"
#: a formula matplotlib's math parser refuses ("$a^$": a superscript of nothing)
BAD_MATH = r"$a^$ and $\frac{1}{2$"


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"uncaught {type(res.exception).__name__}: {res.exception}\n{res.output}")
    return res.exit_code, res.output


def hostile_manifest(tmp_path: Path, **change: Any) -> Path:
    """The minimal test manifest (Perf 2.5 NGC PyTorch, re-derived from the bundled logs) with changes."""
    doc = json.loads(json.dumps(MINIMAL))
    doc["title"] = f"title {TERMINAL_ATTACK} {BAD_MATH}"
    doc["published"][0]["cite"]["title"] = f"cite {TERMINAL_ATTACK} {BAD_MATH}"
    for key, value in change.items():
        doc[key] = value
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def first_log() -> tuple[str, Path]:
    """The --map key of the test manifest's first published cell and its bundled log."""
    cell = MINIMAL["published"][0]["cells"][0]
    key = f"{cell['nodes']}n{cell['gpus']}g-{cell['precision']}-bs{cell['batch_size']}"
    return key, REPO / MINIMAL["published"][0]["logs"] / cell["log"]


# ------------------------------------------------------------------ item 3: outputs safe for their readers
def test_html_links_are_relative_or_web_and_escaped(tmp_path: Path) -> None:
    key, log = first_log()
    named = tmp_path / "javascript:alert(document.cookie)"
    shutil.copy(log, named)
    m = hostile_manifest(tmp_path)
    doc = yaml.safe_load(m.read_text())
    doc["published"][0]["cite"]["repository"] = "https://github.com/x'onmouseover='alert(1)"
    m.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, page = invoke("report", str(m), "--map", f"{key}={named}", "--format", "html")
    assert code == 8, page  # one cell mapped: the others are 'not run'
    hrefs = re.findall(r"href='([^']*)'", page)
    assert hrefs[0].startswith("https://github.com/x&#x27;onmouseover=&#x27;alert(1)/blob/"), hrefs
    assert hrefs[1] == "javascript%3Aalert%28document.cookie%29", hrefs  # the mapped log, a relative link
    assert all(h.startswith("logs/published/") for h in hrefs[2:]), hrefs  # the other cells' bundled logs
    assert "\x1b" not in page and "\x07" not in page
    assert "<img alt='published vs reproduced' src='data:image/png;base64," in page  # the chart drawn


def test_csv_neutralises_formulas_and_keeps_numbers(tmp_path: Path) -> None:
    key, log = first_log()
    named = tmp_path / "=HYPERLINK(1)"
    shutil.copy(log, named)
    m = hostile_manifest(tmp_path)
    code, text = invoke("report", str(m), "--map", f"{key}={named}", "--format", "csv")
    assert code == 8, text  # one cell mapped: the others are 'not run'
    df = pd.read_csv(io.StringIO(text))
    assert df.loc[0, "log"] == "'=HYPERLINK(1)"  # OWASP: a leading ' makes it text
    raw = df["log"].str.replace(r"^'(?=[=+\-@\t\r])", "", regex=True)  # the README's way back to the value
    assert raw[0] == named.name
    for col in ("published", "reproduced", "delta_pct", "nodes", "gpus", "repeats"):
        assert pd.api.types.is_numeric_dtype(df[col]), (col, df[col].dtype)
    texts = [v for col in df.columns if not pd.api.types.is_numeric_dtype(df[col]) for v in df[col].dropna()]
    assert texts and not [v for v in texts if v.startswith(FORMULA_START)]


def test_junit_is_valid_xml_with_control_characters_in_a_note(tmp_path: Path) -> None:
    key, _ = first_log()
    bad = tmp_path / "log\x01\x0b\x1b[31m.txt"  # not a log of the cell: its name reaches the cell's note
    bad.write_text("no throughput here\n")
    m = hostile_manifest(tmp_path)
    code, text = invoke("report", str(m), "--map", f"{key}={bad}", "--format", "junit", "--no-record")
    root = ET.fromstring(text.encode())  # raises on a character XML forbids
    failures = [f.get("message") for f in root.iter("failure")]
    assert failures and code != 0


@pytest.mark.parametrize("args", [["show", "{m}"], ["plan", "{m}"], ["report", "{m}"],
                                  ["report", "{m}", "--format", "md"]])
def test_terminal_output_holds_no_control_sequence(tmp_path: Path, args: list[str]) -> None:
    m = hostile_manifest(tmp_path)
    code, out = invoke(*[a.format(m=m) for a in args])
    assert code == 0, out
    assert "title " in out or "cite " in out
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", out), repr(out[:300])


def test_strip_control_exact() -> None:
    text = ("a\x1b[31mb\x1b[0m\x1b]8;;javascript:x\x1b\\c\x1b]8;;\x1b\\\x1b]0;t\x07d"
            "\r\x00e\u202ef\tg\nh\x9b2Ji")
    assert strip_control(text) == "abcdef\tg\nhi"
    assert strip_control(text, colour=True) == "a\x1b[31mb\x1b[0mcdef\tg\nhi"  # only the kit's own colours


def test_chart_titles_are_plain_text(tmp_path: Path) -> None:
    code, out = invoke("report", str(hostile_manifest(tmp_path)), "--plot", str(tmp_path / "c.png"))
    assert code == 0, out
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, page = invoke("report", str(hostile_manifest(tmp_path)), "--format", "html")
    assert code == 0 and "data:image/png;base64," in page and "could not be drawn" not in page


def test_a_chart_that_cannot_be_drawn_does_not_stop_the_archive(tmp_path: Path) -> None:
    from repro.verdict.reproduce import reproduce_table
    from repro.up.finishing import _draw_chart

    m = load_manifest(hostile_manifest(tmp_path))
    run = RunDir.create(tmp_path / "logs", m, load_hosts(None), env={})
    run.file("report.png").mkdir()  # the chart cannot be written where it goes
    table = reproduce_table(m, m.table())
    why = _draw_chart(table, run)
    assert why and why.startswith("IsADirectoryError")
    run.file("report.png").rmdir()
    assert create(run).is_file()


# ------------------------------------------------------------------ item 4: secrets by shape
SECRETS = {"TOKEN": "tk-0123456789", "AUTH": "au-0123456789", "PHRASE": "pp-0123456789",
           "PASSWORD": "pw-0123456789", "URLTOKEN": "ghp0123456789",
           "SLASHPW": "pa/ss-0123456789", "DBPASS": "db-0123456789",
           "HOOK": "hk-0123456789", "BEARER": "br-0123456789", "COOKIE": "ck-0123456789"}


def secret_command() -> list[str]:
    s = SECRETS
    return ["--token", s["TOKEN"], f"--auth={s['AUTH']}", f"--passphrase={s['PHRASE']}",
            "--password", s["PASSWORD"], f"https://{s['URLTOKEN']}@git.example.org/x.git",
            f"https://bob:{s['SLASHPW']}@db.example.org/x",
            "-H", f"Authorization: Bearer {s['BEARER']}", "-H", f"Cookie: session={s['COOKIE']}", "-p", "1"]


def test_redact_shapes_exact() -> None:
    assert redact_argv(["python", *secret_command(), "--tokenizer", "bert", "--key-file={data}/k"]) == [
        "python", "--token", REDACTED, f"--auth={REDACTED}", f"--passphrase={REDACTED}",
        "--password", REDACTED,
        f"https://{REDACTED}@git.example.org/x.git", f"https://bob:{REDACTED}@db.example.org/x",
        "-H", f"Authorization: {REDACTED}", "-H", f"Cookie: {REDACTED}", "-p", "1", "--tokenizer", "bert",
        "--key-file={data}/k"]
    assert redact_argv(["sshpass", "-p", "hunter22", "ssh", "-p", "22", "h"]) == \
        ["sshpass", "-p", REDACTED, "ssh", "-p", "22", "h"]
    assert redact_argv(["curl", "-u", "u:pw123456", "ssh://git@host/r", "https://host:8080/a@b"]) == \
        ["curl", "-u", REDACTED, "ssh://git@host/r", "https://host:8080/a@b"]
    text = "x --password 'a b' DB_PASS=1 SLACK_WEBHOOK=\"h\" authorization: Basic Zm9v\n-p 1 ips: 2"
    assert redact_text(text) == (f"x --password '{REDACTED}' DB_PASS={REDACTED} SLACK_WEBHOOK=\"{REDACTED}\" "
                                 f"authorization: {REDACTED}\n-p 1 ips: 2")
    env = {"DB_PASS": "x", "SLACK_WEBHOOK": "y", "GH_AUTH": "z", "PWD": "/w", "ARGS": "--token q"}
    assert redact_env(env) == {"DB_PASS": REDACTED, "SLACK_WEBHOOK": REDACTED, "GH_AUTH": REDACTED,
                               "PWD": "/w", "ARGS": f"--token {REDACTED}"}
    again = redact_text(redact_text(" ".join(secret_command())))
    assert again == redact_text(" ".join(secret_command()))  # idempotent: a redacted text passes unchanged


def secret_manifest(tmp_path: Path) -> Path:
    doc = json.loads(json.dumps(MINIMAL))
    doc["launch"]["command"] = [*doc["launch"]["command"], *secret_command()]
    doc["launch"]["env"] = {"DB_PASS": SECRETS["DBPASS"],
                            "SLACK_WEBHOOK": f"https://hooks.example.org/{SECRETS['HOOK']}"}
    doc["published"][0]["cite"]["repository"] = f"https://{SECRETS['URLTOKEN']}@github.com/PaddlePaddle/Perf"
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def leaked(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [v for v in SECRETS.values() if v.encode() in data]


def test_plan_show_and_report_print_no_secret_of_any_shape(tmp_path: Path) -> None:
    m = str(secret_manifest(tmp_path))
    for args in (["plan", m], ["show", m], ["show", m, "--format", "json"], ["show", m, "--format", "yaml"],
                 ["report", m], ["report", m, "--format", "html"], ["report", m, "--format", "csv"]):
        code, out = invoke(*args)
        assert code == 0, (args, out)
        assert not leaked(out), (args, leaked(out))
    assert f"-e=DB_PASS={REDACTED}" in invoke("plan", m)[1]
    assert f"Published in https://{REDACTED}@github.com/PaddlePaddle/Perf" in invoke("report", m)[1]


def test_check_prints_no_repository_credentials(tmp_path: Path) -> None:
    doc = yaml.safe_load(secret_manifest(tmp_path).read_text())
    doc["source"]["repository"] = f"http://bob:{SECRETS['SLASHPW']}@127.0.0.1:9/x.git"  # nothing listens
    m = tmp_path / "check.yaml"
    m.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out = invoke("check", str(m))
    assert code != 0 and "127.0.0.1:9" in out, out
    assert not leaked(out), out


def test_progress_run_directory_archive_and_provenance_hold_no_secret(tmp_path: Path) -> None:
    lines = io.StringIO()
    PlainProgress(lines)(Event("step", "start: " + " ".join(secret_command()) + TERMINAL_ATTACK))
    PlainProgress(lines, json_lines=True)(Event("info", "pull", data={"cmd": " ".join(secret_command())}))
    assert not leaked(lines.getvalue()) and "\x1b" not in lines.getvalue()
    manifest = load_manifest(secret_manifest(tmp_path))
    run = RunDir.create(tmp_path / "logs", manifest, load_hosts(None), env={"HOME": "/root"})
    record = provenance.new_record(run, manifest, load_hosts(None), started="2026-11-22T11:15:00Z")
    cell = manifest.cells()[0]
    log = run.write_log(cell, 1, 0, "n1", (" ".join(secret_command()) + "\n").encode())
    provenance.add_command(record, run, cell, 1, rank=0, node="n1", role="worker",
                           argv=["python", "main.py", *secret_command()], env=dict(manifest.launch.env),
                           image="sha256:" + "0" * 64, started="2026-11-22T11:15:01Z",
                           ended="2026-11-22T11:20:00Z", exit_code=0, log=log)
    provenance.finalize(run, record, finished="2026-11-22T12:00:00Z")
    archive = create(run)
    import gzip

    for p in [*run.path.rglob("*"), archive]:
        if p.is_file():
            data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
            assert not leaked(data), (p, leaked(data))
    written = provenance.read_record(run.file("provenance.json"))
    assert _manifest_check(run, written).status == OK  # audit verifies the redacted manifest


# ------------------------------------------------------------------ item 5: bounded and tidy
#: deeper than Python's recursion limit, shallower than PATH_MAX allows to remove by path
DEPTH = 1500


@pytest.fixture
def deep(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Makes trees nested DEPTH levels deep; ``repro.tree.remove`` takes them after (pytest's own clean-up
    recurses)."""
    from repro.tree import remove

    made: list[Path] = []
    yield lambda root: made.append(deep_tree(root, DEPTH)) or root
    for root in made:
        remove(root)
        assert not root.exists()


def deep_tree(root: Path, depth: int) -> Path:
    """``root`` holding a/a/a/... ``depth`` levels deep (made through directory descriptors)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            nxt = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    return root


def test_remove_takes_a_tree_whole_and_follows_no_link(tmp_path: Path) -> None:
    from repro.tree import remove

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("x")
    root = deep_tree(tmp_path / "root", 40)  # DEPTH levels: the trees of ``deep``, removed by it
    (root / "b").mkdir()
    for i in range(20):
        (root / "b" / f"f{i}").write_text("x")
    (root / "b" / "link").symlink_to(outside)
    (root / "file").write_text("y")
    remove(root)
    assert not root.exists() and [p.name for p in outside.iterdir()] == ["kept"]
    remove(outside / "kept")
    remove(tmp_path / "absent")
    assert list(outside.iterdir()) == []


def test_a_deep_log_tree_is_exit_2(tmp_path: Path, deep: Any) -> None:
    t0 = time.monotonic()
    code, out = invoke("report", "ngc-pytorch-rn50-v100", "--from-logs", str(deep(tmp_path / "logs")))
    assert code == 2 and "nested deeper than 32 levels" in out and str(tmp_path / "logs") in out, out
    assert time.monotonic() - t0 < 10


def test_a_deep_run_directory_is_exit_6(tmp_path: Path, deep: Any) -> None:
    from test_provenance import make_run

    run = make_run(tmp_path / "runs")
    deep(run.path / "cells" / "deep")
    for args in (["audit", str(run.path)], ["report", str(run.path)]):
        code, out = invoke(*args)
        assert code == 6 and "nested deeper than 32 levels" in out, (args, out)


def test_plan_summarises_large_cells_and_bounds_its_output(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "manifests" / "paddle-rn50-cpu.yaml").read_text())
    doc.update(id="wide-paddle")
    doc.pop("expect", None)
    doc["matrix"]["nodes"] = [17, 4096]
    m = tmp_path / "wide.yaml"
    m.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out = invoke("plan", str(m), "--cells", "nodes=17")
    assert code == 0, out
    assert re.findall(r"^  rank (\d+) ", out, re.M) == ["0", "1", "16"]
    assert ("  ... 14 more ranks, 2 to 15 on node3 to node16 (14 worker), not shown: "
            "`repro plan --all` shows every rank") in out
    code, every = invoke("plan", str(m), "--cells", "nodes=17", "--all")
    assert code == 0 and re.findall(r"^  rank (\d+) ", every, re.M) == [str(i) for i in range(17)]
    t0 = time.monotonic()
    code, big = invoke("plan", str(m), "--cells", "nodes=4096")
    assert code == 0 and len(big) < 400_000, len(big)  # three ranks, each naming the 4096 hosts once or twice
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------ item 6: --map keys, one inventory check
def test_a_map_key_that_names_no_cell_is_exit_2_listing_the_cells(tmp_path: Path) -> None:
    _, log = first_log()
    code, out = invoke("report", "ngc-pytorch-rn50-v100", "--map", f"1n8g-fp32-bs999={log}")
    assert code == 2 and "--map 1n8g-fp32-bs999: no such cell" in out, out
    m = find_target("ngc-pytorch-rn50-v100")
    assert all(f"ngc-pytorch-rn50-v100/{c.nodes}n{c.gpus // c.nodes}g-{c.precision}-bs{c.batch_size}" in out
               for c in m.table().cells)


def readme_slurm_inventory() -> str:
    text = (REPO / "docs" / "howto" / "slurm-docker.md").read_text()
    return re.search(r"# Slurm \+ Docker.*?```yaml\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("content,code", [
    (readme_slurm_inventory(), 0),
    ("schema_version: 1\nscheduler: {kind: ssh}\n", 2),  # no nodes, and not Slurm
    ("schema_version: 1\nenv: {A: b}\n", 2),
    ("schema_version: 1\nscheduler: {kind: slurm, partition: gpu, colour: red}\n", 2),
])
def test_validate_and_plan_accept_and_reject_the_same_inventories(tmp_path: Path, content: str,
                                                                   code: int) -> None:
    hosts = tmp_path / "inventory.yaml"
    hosts.write_text(content)
    got_validate, out_v = invoke("validate", str(hosts))
    got_plan, out_p = invoke("plan", "torch-rn50-cpu", "--hosts", str(hosts))
    assert (got_validate, got_plan) == (code, code), (out_v, out_p)
    if code == 0:
        assert out_v == f"ok {hosts} (hosts)\n"
