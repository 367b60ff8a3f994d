"""Secrets are never shown: what repro.redact blanks, and that plan, show, progress and the run
directory print and record none of a manifest's or inventory's secrets, while audit still
verifies the redacted manifest as the one the run recorded."""

from __future__ import annotations

import io
import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from repro.record import provenance
from repro.record.audit import OK, _manifest_check
from repro.cli import cli
from repro.spec.hosts import load_hosts
from repro.events import Event
from repro.spec.manifest import load_manifest
from repro.progress import PlainProgress
from repro.redact import REDACTED, redact_argv, redact_document, redact_env, redact_text
from repro.run.rundir import RunDir

DATA = Path(__file__).resolve().parent / "data"
KEY, TOKEN, PASSWORD, URL_PW, SITE = "wk-0123456789", "tk-abcdefghij", "pw-hunter2hunter2", "dbpass-77777", "site-s3cr3t-1"
SECRETS = (KEY, TOKEN, PASSWORD, URL_PW, SITE)


def test_redact_argv_exact() -> None:
    argv = ["python", f"--wandb-key={KEY}", "--api-token", TOKEN, f"-e=WANDB_API_KEY={KEY}", f"--db-password={PASSWORD}",
            f"DATABASE_URL=postgres://app:{URL_PW}@db:5432/x", "--batch-size={batch_size}", "--key-file={data}/k",
            "-b", "256", "--monkey", "1"]
    assert redact_argv(argv) == [
        "python", "--wandb-key=<redacted>", "--api-token", "<redacted>", "-e=WANDB_API_KEY=<redacted>",
        "--db-password=<redacted>", "DATABASE_URL=postgres://app:<redacted>@db:5432/x", "--batch-size={batch_size}",
        "--key-file={data}/k", "-b", "256", "--monkey", "<redacted>"]


def test_redact_text_and_env_exact() -> None:
    line = f"run --wandb-key={KEY} with HF_TOKEN={TOKEN} at https://bob:{URL_PW}@host/x; ips: 1234.5 key: value"
    assert redact_text(line) == ("run --wandb-key=<redacted> with HF_TOKEN=<redacted> at https://bob:<redacted>@host/x; "
                                 "ips: 1234.5 key: value")
    assert redact_env({"DATABASE_URL": f"mysql://u:{URL_PW}@h/d", "AWS_SECRET_ACCESS_KEY": KEY, "NCCL_DEBUG": "INFO"}) == {
        "DATABASE_URL": "mysql://u:<redacted>@h/d", "AWS_SECRET_ACCESS_KEY": REDACTED, "NCCL_DEBUG": "INFO"}
    assert redact_text("https://github.com/NVIDIA/DeepLearningExamples ips: 12") == \
        "https://github.com/NVIDIA/DeepLearningExamples ips: 12"


def secret_manifest(tmp_path: Path) -> Path:
    doc = yaml.safe_load((DATA / "good" / "minimal.yaml").read_text())
    doc["launch"]["command"] += [f"--wandb-key={KEY}", "--hub-token", TOKEN]
    doc["launch"]["env"] = {"WANDB_API_KEY": KEY, "DATABASE_URL": f"postgres://app:{URL_PW}@db/x", "NCCL_DEBUG": "INFO"}
    doc["launch"]["cell_args"] = [{"when": {"gpus": 8}, "env": {"DB_PASSWORD": PASSWORD}}]
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def secret_hosts(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text("schema_version: 1\nnodes: [{name: n1, address: 10.0.0.1}]\n"
                    f"env: {{REGISTRY_TOKEN: {SITE}, NCCL_SOCKET_IFNAME: ib0}}\n")
    return path


def shown(res) -> str:
    assert res.exit_code == 0, res.output
    return res.output


def test_plan_and_show_print_no_secret(tmp_path: Path) -> None:
    m, h = secret_manifest(tmp_path), secret_hosts(tmp_path)
    outputs = [shown(CliRunner().invoke(cli, ["plan", str(m), "--hosts", str(h)])),
               *(shown(CliRunner().invoke(cli, ["show", str(m), "--format", f])) for f in ("text", "json", "yaml"))]
    for out in outputs:
        assert not [s for s in SECRETS if s in out], out
    assert "-e=WANDB_API_KEY=<redacted>" in outputs[0] and "-e=REGISTRY_TOKEN=<redacted>" in outputs[0]
    assert "'--wandb-key=<redacted>' --hub-token '<redacted>'" in outputs[0]
    assert "NCCL_DEBUG=INFO" in outputs[0] and "postgres://app:<redacted>@db/x" in outputs[1]
    assert json.loads(outputs[2])["launch"]["env"]["WANDB_API_KEY"] == REDACTED


def test_progress_lines_print_no_secret() -> None:
    out = io.StringIO()
    progress = PlainProgress(out)
    progress(Event("step", f"start: python main.py --wandb-key={KEY}", data={"cmd": f"HF_TOKEN={TOKEN}"}))
    json_out = io.StringIO()
    PlainProgress(json_out, json_lines=True)(Event("info", f"pull https://u:{URL_PW}@reg/x", data={"k": f"--x-token={TOKEN}"}))
    for text in (out.getvalue(), json_out.getvalue()):
        assert not [s for s in SECRETS if s in text], text
    assert "--wandb-key=<redacted>" in out.getvalue()


def test_run_directory_holds_no_secret_and_audit_verifies_the_redacted_manifest(tmp_path: Path) -> None:
    manifest = load_manifest(secret_manifest(tmp_path))
    hosts = load_hosts(secret_hosts(tmp_path))
    run = RunDir.create(tmp_path / "logs", manifest, hosts, env={"HOME": "/root"})
    record = provenance.new_record(run, manifest, hosts, started="2026-11-22T11:15:00Z")
    cell = manifest.cells()[0]
    log = run.write_log(cell, 1, 0, "n1", f"argv: python main.py --wandb-key={KEY} --hub-token {TOKEN}\n".encode())
    provenance.add_command(record, run, cell, 1, rank=0, node="n1", role="worker",
                           argv=["python", "main.py", f"--wandb-key={KEY}", "--hub-token", TOKEN],
                           env={"WANDB_API_KEY": KEY, "DATABASE_URL": f"postgres://a:{URL_PW}@d/x"}, image="sha256:" + "0" * 64,
                           started="2026-11-22T11:15:01Z", ended="2026-11-22T11:20:00Z", exit_code=0, log=log)
    provenance.finalize(run, record, finished="2026-11-22T12:00:00Z")
    for p in run.path.rglob("*"):
        if p.is_file():
            assert not [s for s in SECRETS if s.encode() in p.read_bytes()], p
    written = provenance.read_record(run.file("provenance.json"))
    assert written.manifest.redacted == (
        "launch.command[20]", "launch.command[22]", "launch.env.WANDB_API_KEY", "launch.env.DATABASE_URL",
        "launch.cell_args[0].env.DB_PASSWORD")
    check = _manifest_check(run, written)
    assert (check.item, check.status) == ("manifest.yaml (redacted)", OK), check
    # the redacted copy is verified, not waved through: change it and audit says so
    text = run.file("manifest.yaml").read_text().replace("NCCL_DEBUG: INFO", "NCCL_DEBUG: WARN")
    run.file("manifest.yaml").write_text(text)
    assert _manifest_check(run, written).status == "tampered"


def test_redact_document_names_what_it_blanked() -> None:
    doc, done = redact_document({"launch": {"env": {"A_TOKEN": "x", "B": "https://u:p@h"}, "command": ["--k", "v"]},
                                 "image": {"build": {"base": {"digest": "", "ref": "a:b"}}}})
    assert done == ["launch.env.A_TOKEN", "launch.env.B"]
    assert doc["launch"]["env"] == {"A_TOKEN": REDACTED, "B": "https://u:<redacted>@h"}


def test_a_redacted_run_resumes_only_with_its_original_manifest(tmp_path: Path) -> None:
    import pytest

    from repro.errors import UsageError
    from repro.up import UpOptions
    from repro.up.attached import manifest_and_hosts

    path = secret_manifest(tmp_path)
    hosts = secret_hosts(tmp_path)
    run = RunDir.create(tmp_path / "logs", load_manifest(path), load_hosts(hosts), env={})
    opts = UpOptions(resume=run.path, hosts_file=hosts)
    with pytest.raises(UsageError, match="secret values redacted, so it cannot be run again"):
        manifest_and_hosts(None, opts)
    manifest, _, resumed = manifest_and_hosts(str(path), opts)
    assert KEY in manifest.launch.env.values() and resumed is not None and resumed.path == run.path
    other = tmp_path / "other.yaml"
    other.write_text(path.read_text().replace(KEY, "wk-another-key"))
    with pytest.raises(UsageError, match="is not the manifest"):
        manifest_and_hosts(str(other), opts)
