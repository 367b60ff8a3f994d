"""Run directories, provenance records, the in-toto export, audit and diff (no Docker needed).

A run of ngc-pytorch-rn50-v100 is simulated: the publisher's own logs become the
rank-0 logs of its cells, the probes report the publication's hardware, so the run
re-derives the published table and audits clean; then single facts are changed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from repro.record import provenance
from repro.record.audit import DRIFT, OK, audit, cudnn_text, failing, words_match
from repro.cli import cli
from repro.record.diff import diff
from repro.errors import ProvenanceError, UsageError
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import Cell, find_target
from repro.nodes.facts import parse_ibstat
from repro.nodes.facts import host_facts, node_script, parse_sections
from repro.verdict.reproduce import reproduce_run, reproduce_table
from repro.run.rundir import DONE, FAILED, PENDING, RUNNING, LogWriter, RunDir, make_run_id, parse_cell_key
from repro.redact import Redactor
from repro.spec.schema import load_schema
from repro.up import write_reports

TARGET = "ngc-pytorch-rn50-v100"
SECRET_HOSTS = "hosts-Secret-0a1b2c3d4e"      # a hosts file env value under a secret name
SECRET_PROC = "proc-Password-5f6e7d8c9b"      # this process's env, under a secret name
SECRET_CMD = "cmd-Token-1122334455"           # a container's env, under a secret name
IMAGE_ID = "sha256:" + "ab" * 32
BASE_DIGEST = "sha256:" + "cd" * 32


def ok(v: Any) -> dict[str, Any]:
    return {"value": v, "reason": None}


def no(reason: str) -> dict[str, Any]:
    return {"value": None, "reason": reason}


def fake_host(name: str, driver: str = "525.60.11") -> dict[str, Any]:
    """What the host probes report on one of the publisher's V100 nodes."""
    gpu = {"index": 0, "name": "Tesla V100-SXM2-32GB", "uuid": "GPU-1", "pci_bus_id": "00000000:1A:00.0",
           "memory_mib": 32510, "driver": driver, "clocks_max_sm_mhz": 1530, "clocks_max_mem_mhz": 877,
           "clocks_app_mhz": 1290, "ecc": "Enabled", "vbios": "88.00.80.00.01"}
    return {"hostname": ok(name), "os": ok({"pretty_name": "CentOS Linux 7 (Core)", "id": "centos", "version_id": "7",
                                            "release": "CentOS Linux release 7.5.1804 (Core)"}),
            "kernel": ok({"release": "3.10.0-862.el7.x86_64", "machine": "x86_64"}),
            "cpu": ok({"model": "Intel(R) Xeon(R) Gold 6271C CPU @ 2.60GHz", "sockets": 2, "cores_per_socket": 24,
                       "threads_per_core": 2, "logical_cpus": 96}),
            "memory": ok({"total_bytes": 512 << 30}), "gpus": ok([dict(gpu, index=i) for i in range(8)]),
            "cuda_driver": ok("12.0"), "gpu_topology": ok("GPU0 X NV1"),
            "hcas": ok([{"ca": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 100.0, "link_layer": "InfiniBand",
                         "fw": "16.27.2008"}]),
            "mlx5_core": ok("5.0-2.1.8"), "docker": ok({"version": "19.03.5", "api_version": "1.40",
                                                        "runtimes": ["nvidia", "runc"], "default_runtime": "runc",
                                                        "storage_driver": "overlay2"})}


def fake_container(version: str = "1.9.0a0+df837d0") -> dict[str, Any]:
    torch = {"version": version, "build": {"cuda": "11.2", "cudnn": 8100, "nccl": "2.8.4", "git": "df837d0"}}
    return ok({"probe": "repro-container-probe", "probe_version": 1, "python": ok({"version": "3.8.5"}),
               "frameworks": {"torch": ok(torch), "paddle": no("not installed")},
               "pip_freeze": ok(["torch==" + version]),
               "ofed": ok("MLNX_OFED_LINUX-5.0-2.1.8.0"), "rdma_core": no("no rdma-core"), "env_versions": {},
               "sources": {"/workspace/DeepLearningExamples": ok({"commit": "fc9c09b08d6d39fb13c79c8a7e08f85b03dbf3d1",
                                                                  "how": ".repro-source.json"})}})


def make_run(root: Path, *, driver_on_last: str = "525.60.11") -> RunDir:
    """A sealed run directory of TARGET whose rank-0 logs are the published logs."""
    m = find_target(TARGET)
    nodes = tuple(Node(f"node{i}", f"10.0.0.{i + 1}", user="root") for i in range(4))
    hosts = Hosts(nodes, env={"NCCL_SOCKET_IFNAME": "ib0", "WANDB_API_KEY": SECRET_HOSTS})
    run = RunDir.create(root, m, hosts, env={"REGISTRY_PASSWORD": SECRET_PROC, "HOME": "/root"})
    run.redactor = Redactor([*run.redactor.values, SECRET_CMD])  # repro up adds the containers' env values
    record = provenance.new_record(run, m, hosts, started="2026-11-22T11:15:00Z")
    for i, node in enumerate(nodes):
        provenance.add_node(record, node, host=fake_host(node.name, driver_on_last if i == 3 else "525.60.11"),
                            image={"ref": "repro/ngc-pytorch-rn50:21.03-fc9c09b", "id": IMAGE_ID, "digest": None,
                                   "labels": {"org.opencontainers.image.base.digest": BASE_DIGEST}},
                            container=fake_container())
    for pc in m.table().cells:
        cell = Cell(pc.nodes, pc.gpus // pc.nodes, pc.precision, pc.batch_size)
        run.set_status(cell, 1, RUNNING)
        for rank in range(cell.nodes):
            if rank == 0:
                path = run.write_log(cell, 1, 0, "node0", pc.logs[0].read_bytes())
            else:
                # output written by other code (as repro.run.launch does), secrets and all
                path = run.log_dir(cell, 1) / f"rank{rank}-node{rank}.log"
                path.write_text(f"worker {rank}\nNCCL INFO Channel 00 : 0[0] -> 8[0] [send] via NET/IB/0\n"
                                f"env: API_TOKEN={SECRET_CMD}\n")
            provenance.add_command(record, run, cell, 1, rank=rank, node=f"node{rank}", role="worker",
                                   argv=["python", "./main.py", "-b", "256"], image=IMAGE_ID,
                                   env={"NCCL_DEBUG": "INFO", "API_TOKEN": SECRET_CMD}, started="2026-11-22T11:15:01Z",
                                   ended="2026-11-22T11:20:00.123+00:00", exit_code=0, log=path)
        run.set_status(cell, 1, DONE)
    write_reports(run, [reproduce_run(run.path, source=run.run_id)])
    provenance.finalize(run, record, finished="2026-11-22T12:00:00Z")
    return run


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return make_run(tmp_path_factory.mktemp("runs"))


def all_bytes(root: Path) -> list[tuple[str, bytes]]:
    return [(str(p), p.read_bytes()) for p in root.rglob("*") if p.is_file()]


# ------------------------------------------------------------------ run directory
def test_run_id_and_layout(sealed: RunDir) -> None:
    assert parse_cell_key("4n8g-amp-bs256") == Cell(4, 8, "amp", 256)
    rid = make_run_id("torch rn50/cpu", short="3f9a1c")
    assert rid.endswith("-torch-rn50-cpu-3f9a1c") and rid[8] == "T" and rid[15] == "Z"
    names = set(sealed.files())
    assert {"manifest.yaml", "hosts.yaml", "state.json", "report.md", "report.csv", "report.json", "provenance.json",
            "provenance.intoto.json"} <= names
    assert "cells/4n8g-fp32-bs256/r1/0-node0.log" in names
    assert [p.name for p in sealed.logs_for("4n8g-fp32-bs256", 1)] == ["0-node0.log", "rank1-node1.log",
                                                                       "rank2-node2.log", "rank3-node3.log"]
    sums = sealed.file("SHA256SUMS").read_text().splitlines()
    assert [ln.split("  ", 1)[1] for ln in sums] == sealed.files()


def test_create_refuses_existing_and_open_refuses_other_dirs(tmp_path: Path) -> None:
    m = find_target(TARGET)
    hosts = Hosts((Node("n", "127.0.0.1"),))
    RunDir.create(tmp_path, m, hosts, run_id="20260101T000000Z-x-aaaaaa", env={})
    with pytest.raises(UsageError, match="already exists"):
        RunDir.create(tmp_path, m, hosts, run_id="20260101T000000Z-x-aaaaaa", env={})
    with pytest.raises(UsageError, match="not a run directory"):
        RunDir.open(tmp_path)


def test_state_is_written_atomically_and_tracks_repeats(tmp_path: Path) -> None:
    m = find_target(TARGET)
    run = RunDir.create(tmp_path, m, Hosts((Node("n", "127.0.0.1"),)), env={})
    state = run.read_state()
    assert sorted(state["cells"]) == sorted(c.key for c in m.cells())
    assert {r["status"] for c in state["cells"].values() for r in c["repeats"].values()} == {PENDING}
    run.set_status("1n1g-fp32-bs256", 1, RUNNING)
    entry = run.set_status("1n1g-fp32-bs256", 1, FAILED, "node n lost")
    assert entry["attempts"] == 1 and entry["why"] == "node n lost" and entry["ended"]
    run.set_status("1n8g-fp32-bs256", 1, DONE)
    assert ("1n1g-fp32-bs256", 1) in run.pending() and ("1n8g-fp32-bs256", 1) not in run.pending()
    assert not [p for p in run.path.iterdir() if p.name.endswith(".part")]
    with pytest.raises(UsageError):
        run.set_status("1n1g-fp32-bs256", m.matrix["repeats"] + 1, DONE)  # no such repeat


def test_log_writer_scrubs_secrets_split_across_writes(tmp_path: Path) -> None:
    red = Redactor(["abcdef-SECRET-123456"])
    with LogWriter(tmp_path / "x.log", red) as w:
        w.write(b"line one\nkey=abcdef-SEC")
        w.write(b"RET-123456 tail")
        w.write(b"x" * 70000 + b"abcdef-SECRET-")
        w.write(b"123456\n")
    text = (tmp_path / "x.log").read_text()
    assert "SECRET" not in text and text.count("<redacted>") == 2 and text.startswith("line one\nkey=<redacted> tail")


# ------------------------------------------------------------------ provenance record
def test_record_validates_and_schema_is_versioned(sealed: RunDir) -> None:
    schema = load_schema("provenance.v1")
    jsonschema.Draft202012Validator.check_schema(schema)
    record = provenance.load_record(sealed.file("provenance.json"))
    assert record["schema_version"] == 1 and record["target"] == TARGET
    assert record["manifest"]["sha256"] == find_target(TARGET).sha256
    assert len(record["commands"]) == 12 and len(record["logs"]) == 12
    cmd = next(c for c in record["commands"] if c["rank"] == 1)
    assert cmd["env"]["API_TOKEN"] == "<redacted>" and cmd["env"]["NCCL_DEBUG"] == "INFO"
    assert cmd["nccl_transport"]["value"]["transport"] == "IB"
    assert record["outcome"]["done"] == 6 and record["results"].keys() == {"report.md", "report.csv", "report.json"}
    bad = dict(record, schema_version=2)
    with pytest.raises(ProvenanceError, match="schema_version 2 is not supported; this kit reads 1") as e:
        provenance.check_record(bad)
    assert e.value.exit_code == 6
    broken = copy.deepcopy(record)
    broken["nodes"][0]["host"]["gpus"] = {"value": None, "reason": None}
    assert provenance.record_problems(broken)


def test_intoto_statement_is_slsa_v1(sealed: RunDir) -> None:
    st = json.loads(sealed.file("provenance.intoto.json").read_text())
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert provenance.statement_problems(st) == []
    subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
    assert {"report.json", "cells/1n1g-fp32-bs256/r1/0-node0.log"} <= set(subjects)
    from repro.digest import sha256_file

    assert all(sha256_file(sealed.path / n) == d for n, d in subjects.items())
    bd = st["predicate"]["buildDefinition"]
    deps = {d["name"]: d for d in bd["resolvedDependencies"]}
    assert deps["source"]["digest"] == {"gitCommit": "fc9c09b08d6d39fb13c79c8a7e08f85b03dbf3d1"}
    assert deps["dataset"]["uri"] == "repro:unspecified"
    assert any(n.startswith("image:") and d["annotations"]["nodes"] == ["node0", "node1", "node2", "node3"]
               for n, d in deps.items())
    assert bd["internalParameters"]["measurement"]["parser"] == "ngc-pytorch"
    assert st["predicate"]["runDetails"]["metadata"]["invocationId"] == sealed.run_id


def test_secrets_never_reach_the_run_directory(sealed: RunDir) -> None:
    for path, data in all_bytes(sealed.path):
        for secret in (SECRET_HOSTS, SECRET_PROC, SECRET_CMD):
            assert secret.encode() not in data, f"{secret} in {path}"
    assert "WANDB_API_KEY: <redacted>" in sealed.file("hosts.yaml").read_text()


# ------------------------------------------------------------------ report, audit, diff
def test_run_rederives_the_published_table(sealed: RunDir) -> None:
    m = find_target(TARGET)
    from_run = reproduce_run(sealed.path)
    bundled = reproduce_table(m, m.table())
    assert [c.reproduced for c in from_run.cells] == [c.reproduced for c in bundled.cells]
    assert all(c.verdict == "match" for c in bundled.cells)  # re-derived from the publication's own logs
    # the same logs in a run directory are a new run of one repeat each: reproduced, no spread known
    assert all(c.verdict == "reproduced" and "no spread known" in c.detail for c in from_run.cells)
    assert from_run.cells[0].logs == ["cells/1n1g-fp32-bs256/r1/0-node0.log"]


def test_cli_report_reads_a_run_directory(sealed: RunDir) -> None:
    res = CliRunner().invoke(cli, ["report", str(sealed.path), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [c["reproduced"] for c in json.loads(res.stdout)] == \
        [c["reproduced"] for c in json.loads(sealed.file("report.json").read_text())]


def test_audit_of_a_faithful_run_is_clean(sealed: RunDir) -> None:
    checks = audit(sealed.path)
    assert failing(checks) == [], "\n".join(map(str, failing(checks)))
    by_item = {c.item: c for c in checks}
    for item in ("gpu_model", "gpu_memory_gb", "driver", "ib_rate_gbps", "interconnect", "nodes", "cpu", "os",
                 "pytorch version", "source commit", "image id"):
        assert by_item[item].status == OK, by_item[item]
    res = CliRunner().invoke(cli, ["audit", str(sealed.path)])
    assert res.exit_code == 0, res.output
    assert "tampered" not in res.output.lower().split("checks")[0].replace("0 tampered", "")


def test_audit_reports_environment_drift_exit_6(tmp_path: Path) -> None:
    run = make_run(tmp_path, driver_on_last="535.104.05")
    drift = failing(audit(run.path))
    assert [(c.item, c.status) for c in drift] == [("driver", DRIFT)]
    assert "node3" in drift[0].detail and "535.104.05" in drift[0].observed
    res = CliRunner().invoke(cli, ["audit", str(run.path)])
    assert res.exit_code == 6 and "DRIFT" in res.output and "1 check(s) failed" in res.output


def test_audit_against_another_target_shows_pin_drift(sealed: RunDir) -> None:
    checks = audit(sealed.path, against="ngc-pytorch-rn50-v100-2.3")
    items = {c.item: c.status for c in failing(checks)}
    assert items.get("manifest") == DRIFT


def test_cudnn_and_word_matching() -> None:
    assert cudnn_text(8100) == "8.1.0" and cudnn_text(90100) == "9.1.0" and cudnn_text("8.0.4") == "8.0.4"
    assert words_match("CentOS 7.5", "CentOS Linux 7 (Core) CentOS Linux release 7.5.1804 (Core)")
    assert words_match("Intel Xeon Gold 6271C", "Intel(R) Xeon(R) Gold 6271C CPU @ 2.60GHz")
    assert not words_match("Intel Xeon Gold 6271C", "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz")


def test_diff_run_against_publication_and_run(sealed: RunDir, tmp_path: Path) -> None:
    out = diff(str(sealed.path), TARGET)
    assert "| 32 GPU (4 nodes) fp32 bs256 | 10523.32 | 10523.32 | +0.00%" in out
    assert "| driver " in out and "DIFFERS" not in out.split("## Pins")[0]
    other = make_run(tmp_path, driver_on_last="535.104.05")
    out2 = diff(str(sealed.path), str(other.path))
    env = out2.split("## Pins")[0]
    assert "node3: 535.104.05" in env and "DIFFERS" in env
    res = CliRunner().invoke(cli, ["diff", str(sealed.path), "no-such-target-xyz"])
    assert res.exit_code == 2 and "neither a run" in res.output


# ------------------------------------------------------------------ host probe parsing
SMI = ("0, Tesla V100-SXM2-32GB, GPU-aa, 00000000:1A:00.0, 32510, 525.60.11, 1530, 877, 1290, Enabled, 88.00.80.00\n"
       "1, Tesla V100-SXM2-32GB, GPU-bb, 00000000:1B:00.0, 32510, 525.60.11, 1530, 877, [N/A], Disabled, 88.00.80.00")
IBSTAT = """CA 'mlx5_0'
\tCA type: MT4119
\tFirmware version: 16.27.2008
\tPort 1:
\t\tState: Active
\t\tRate: 100
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tFirmware version: 16.27.2008
\tPort 1:
\t\tState: Down
\t\tRate: 10
\t\tLink layer: Ethernet
"""


def canned(sections: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The node script's sections as parse_sections reads them from its output."""
    return parse_sections("".join(f"\n@@repro:{k}\n{v}\n@@repro-rc:{rc}\n" for k, (v, rc) in sections.items()))


def test_host_facts_from_gpu_ib_cpu_sections() -> None:
    facts = host_facts(canned({
        "hostname": ("gpu01", 0), "kernel": ("5.15.0", 0), "arch": ("x86_64", 0),
        "lscpu": ("CPU(s):  96\nModel name:  Intel(R) Xeon(R) Gold 6271C CPU @ 2.60GHz\nThread(s) per core: 2\n"
                  "Core(s) per socket: 24\nSocket(s): 2", 0),
        "meminfo": ("MemTotal:       527952108 kB", 0), "gpus": (SMI, 0),
        "smi": ("| NVIDIA-SMI 525.60.11    Driver Version: 525.60.11    CUDA Version: 12.0     |", 0),
        "ib": (IBSTAT, 0), "mlx5": ("5.0-2.1.8", 0),
        "ofed": ((Path(__file__).parent / "data" / "preflight" / "ofed_info-s-internal.txt").read_text(), 0),
        "docker": ("sh: 1: docker: not found", 127)}))
    gpus = facts["gpus"]["value"]
    assert [g["memory_mib"] for g in gpus] == [32510, 32510] and gpus[1]["clocks_app_mhz"] is None
    assert gpus[0] == {"index": 0, "name": "Tesla V100-SXM2-32GB", "uuid": "GPU-aa", "pci_bus_id": "00000000:1A:00.0",
                       "memory_mib": 32510, "driver": "525.60.11", "clocks_max_sm_mhz": 1530, "clocks_max_mem_mhz": 877,
                       "clocks_app_mhz": 1290, "ecc": "Enabled", "vbios": "88.00.80.00"}
    assert gpus[1]["ecc"] == "Disabled"
    assert facts["cuda_driver"]["value"] == "12.0"
    assert facts["cpu"]["value"] == {"model": "Intel(R) Xeon(R) Gold 6271C CPU @ 2.60GHz", "sockets": 2,
                                     "cores_per_socket": 24, "threads_per_core": 2, "logical_cpus": 96}
    assert facts["hcas"]["value"][0] == {"ca": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 100.0,
                                         "link_layer": "InfiniBand", "fw": "16.27.2008"}
    assert facts["kernel"]["value"] == {"release": "5.15.0", "machine": "x86_64"}
    assert facts["docker"] == {"value": None, "reason": "docker info: not found"}
    assert facts["os"]["value"] is None and "no output" in facts["os"]["reason"]
    assert len(parse_ibstat(IBSTAT)) == 2
    assert facts["mofed"] == {"value": "25.01-0.6.0", "reason": None}
    assert facts["mlx5_core"] == {"value": "5.0-2.1.8", "reason": None}


def test_host_facts_read_infiniband_ports_from_sysfs_where_no_tool_is_installed() -> None:
    facts = host_facts(canned({"hostname": ("gpu01", 0),
                               "ib": ("mlx5_0|1|4: ACTIVE|100 Gb/sec (4X EDR)|InfiniBand|16.27.2008\n"
                                      "mlx5_1|1|1: DOWN|40 Gb/sec (4X QDR)|Ethernet|", 0),
                               "mlx5": ("mlx5_core: not loaded", 1)}))
    assert facts["hcas"]["value"] == [
        {"ca": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 100.0, "link_layer": "InfiniBand", "fw": "16.27.2008"},
        {"ca": "mlx5_1", "port": 1, "state": "DOWN", "rate_gbps": 40.0, "link_layer": "Ethernet", "fw": None}]
    assert facts["mlx5_core"] == {"value": None, "reason": "mlx5_core: not loaded"}


def test_host_facts_fail_soft_when_nothing_runs() -> None:
    facts = host_facts({}, "ssh: connection refused")
    assert all(v["value"] is None and "connection refused" in v["reason"] for v in facts.values())


def test_node_script_here_gives_the_host_facts() -> None:
    import subprocess

    out = subprocess.run(["sh", "-c", node_script(None)], check=False, capture_output=True, text=True, timeout=120)
    facts = host_facts(parse_sections(out.stdout))
    assert facts["hostname"]["value"] and facts["kernel"]["value"]["release"]
    assert facts["memory"]["value"]["total_bytes"] > 0
    assert all((v["value"] is None) == isinstance(v["reason"], str) for v in facts.values())
    assert parse_sections("\n@@repro:a\nx\n@@repro-rc:3\n") == {"a": ("x", 3)}


def test_a_target_without_publication_seals_and_resumes(tmp_path: Path) -> None:
    """Measured-only targets (no published table) still get a valid record; hosts.yaml reloads for --resume."""
    from repro.spec.hosts import load_hosts
    from repro.spec.manifest import load_manifest

    m = load_manifest(Path(__file__).parent / "data" / "launch" / "echo.yaml")
    hosts = Hosts((Node("n1", "10.0.0.1"), Node("n2", "10.0.0.2")), data="/data", env={"MY_TOKEN": SECRET_HOSTS})
    run = RunDir.create(tmp_path, m, hosts, env={})
    record = provenance.new_record(run, m, hosts)
    cell = m.cells()[0]
    run.set_status(cell, 1, RUNNING)
    run.write_log(cell, 1, 0, "n1", "rank 0 of 1\ndone\n")
    provenance.add_command(record, run, cell, 1, rank=0, node="n1", role="worker", argv=["sh", "-c", "echo"],
                           env={}, image="repro-test/debian:bookworm", started=provenance.now(),
                           ended=provenance.now(), exit_code=0)
    run.set_status(cell, 1, DONE)
    sealed = provenance.finalize(run, record)
    assert sealed["outcome"]["done"] == 1 and sealed["outcome"]["pending"] == len(m.cells()) - 1
    assert sealed["commands"][0]["nccl_transport"]["value"] is None
    assert not [c for c in audit(run.path) if c.status == "tampered"]
    again = load_hosts(run.file("hosts.yaml"))
    assert [n.name for n in again.nodes] == ["n1", "n2"] and again.data == "/data"
    assert again.env == {"MY_TOKEN": "<redacted>"}


def test_a_run_that_never_sealed_is_not_sealed_not_tampered(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from repro.cli import cli
    from repro.spec.hosts import Hosts, Node
    from repro.spec.manifest import find_target
    from repro.run.rundir import RunDir

    run = RunDir.create(tmp_path, find_target("ngc-pytorch-rn50-v100"), Hosts((Node("node0", "10.0.0.1", user="root"),)))
    (check,) = audit(run.path)
    assert (check.item, check.status) == ("provenance.json", "not sealed") and "never sealed" in check.detail
    res = CliRunner().invoke(cli, ["audit", str(run.path)])
    # its own exit code, 10: a script tells "never finished" from "tampered with" (6) without parsing the table
    assert res.exit_code == 10 and "not sealed" in res.output and "tampered" not in res.output.lower().replace(
        "0 tampered", "")
    assert "repro up --resume" in res.output


def test_tampered_outranks_not_sealed_in_the_exit_code(tmp_path: Path) -> None:
    """An archive of a run that never sealed, changed after its checksum was written, is tampered:
    exit 6, never the milder 10 its unsealed contents alone would give."""
    from repro.record.archive import checksum_file, create

    run = RunDir.create(tmp_path, find_target(TARGET), Hosts((Node("node0", "10.0.0.1", user="root"),)))
    archive = create(run, tmp_path / "run.tar.gz")
    checksum_file(archive).write_text("0" * 64 + "  " + archive.name + "\n")
    res = CliRunner().invoke(cli, ["audit", str(archive)])
    assert res.exit_code == 6, res.output
    res = CliRunner().invoke(cli, ["audit", str(run.path)])
    assert res.exit_code == 10, res.output
