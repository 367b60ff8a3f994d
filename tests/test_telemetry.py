"""Telemetry: the sampler's choices and output bound, and the parsers on real captured tool output
(tests/data/telemetry/README.md says where each file comes from)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from repro.nodes import sampler
from repro.nodes.telemetry import (
    Stream,
    cpu_summary,
    gpu_summary,
    parse_apps_csv,
    parse_gpu_csv,
    parse_loadavg,
    parse_mhz,
    parse_stat_cpu,
    parse_stream,
    reasons,
    summary,
    write_repeat_summary,
)
from repro.run.sampling import sampler_options

DATA = Path(__file__).parent / "data" / "telemetry"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def test_the_sampler_asks_the_tool_which_fields_it_has() -> None:
    chosen = sampler.chosen_fields((DATA / "h100-590.48.01-help-query-gpu.txt").read_text())
    assert chosen == ["timestamp", "index", "uuid", "clocks.current.sm", "clocks.max.sm", "clocks.current.memory",
                      "clocks.max.memory", "power.draw", "enforced.power.limit", "temperature.gpu",
                      "clocks_event_reasons.active", "utilization.gpu", "memory.used", "memory.total"]


def test_a_driver_that_knows_only_throttle_reasons_gets_them() -> None:
    # the 590 help with every "clocks_event_reasons" name taken out: what a driver before the rename lists
    text = (DATA / "h100-590.48.01-help-query-gpu.txt").read_text()
    older = text.replace('"clocks_event_reasons.', '"x.')
    assert "clocks_throttle_reasons.active" in sampler.chosen_fields(older)
    assert "clocks_event_reasons.active" not in sampler.chosen_fields(older)


def test_h100_idle_and_under_load() -> None:
    idle, = parse_gpu_csv(lines("h100-590.48.01-query-gpu-idle.csv"))
    load, = parse_gpu_csv(lines("h100-590.48.01-query-gpu-load.csv"))
    assert (idle["sm_mhz"], idle["sm_max_mhz"], idle["reasons"], idle["utilization_pct"]) == (345.0, 1980.0, 1, 0.0)
    assert reasons(idle["reasons"]) == ["gpu_idle"]
    assert (load["sm_mhz"], load["reasons"], load["utilization_pct"], load["power_w"], load["power_limit_w"]) == \
        (1980.0, 0, 100.0, 631.95, 700.0)
    assert (load["temperature_c"], load["memory_used_mib"], load["memory_total_mib"], load["index"]) == \
        (59.0, 19818.0, 81559.0, 0.0)
    assert load["mem_mhz"] == load["mem_max_mhz"] == 2619.0


def test_a_power_capped_rtx_2080_super() -> None:
    row, = parse_gpu_csv(lines("rtx2080s-595.71.05-query-gpu-idle.csv"))
    assert row["reasons"] == 4 and reasons(row["reasons"]) == ["sw_power_cap"]
    assert (row["sm_mhz"], row["sm_max_mhz"]) == (765.0, 2145.0)


def test_compute_apps_under_load() -> None:
    apps = parse_apps_csv(lines("h100-590.48.01-compute-apps-load.csv"))
    assert [(a["pid"], a["name"], a["memory_mib"]) for a in apps] == [
        ("11327", "/root/tools/memhog", 2566.0), ("11328", "/root/tools/memhog", 1542.0),
        ("11345", "./gpu_burn", 15690.0)]


def test_a_summary_of_the_h100_samples_and_other_processes() -> None:
    text = ["containers " + "a" * 64]
    text += ["gpu " + x for x in lines("h100-590.48.01-query-gpu-idle.csv")]
    text += ["gpu " + x for x in lines("h100-590.48.01-query-gpu-load.csv")[1:]]
    text += ["apps " + x for x in lines("h100-590.48.01-compute-apps-load.csv")]
    text += ["cgroup 11327 -", "cgroup 11328 -", "cgroup 11345 " + "a" * 64]
    s = parse_stream("n1", text)
    g = gpu_summary(s)
    assert g is not None
    assert (g["samples"], g["busy_samples"], g["below_max_share"], g["slowed_share"]) == (2, 1, 0.0, 0.0)
    assert g["reasons"] == {} and g["temperature_max_c"] == 59.0
    assert g["power_of_limit_mean"] == round((69.85 / 700 + 631.95 / 700) / 2, 3)
    # gpu_burn runs in the cell's own container; the two memory hogs are no container of the cell
    assert [(a["pid"], a["name"]) for a in g["other_processes"]] == [("11327", "/root/tools/memhog"),
                                                                    ("11328", "/root/tools/memhog")]


def test_cpu_lines_as_proc_prints_them() -> None:
    assert parse_loadavg("1.45 1.73 2.41 3/184 6041") == (1.45, 1.73, 2.41, 3, 184)
    assert parse_stat_cpu("cpu  1784139 0 300988 261965 26116 0 10236 33139 0 0") == \
        (1784139 + 300988 + 10236 + 33139, 1784139 + 300988 + 261965 + 26116 + 10236 + 33139)
    assert parse_stat_cpu("cpu0 1 2 3 4") is None
    assert parse_mhz("2445.400 2445.400") == [2445.4, 2445.4]
    assert parse_mhz("khz 2100000 800000") == [2100.0, 800.0]


def test_cpu_sampler_output_from_a_cluster_node() -> None:
    s = parse_stream("rc-node1", (DATA / "cpu-sampler-rc-node1.txt").open())
    c = cpu_summary(s)
    assert s.no_gpu and c is not None and c["samples"] == len(s.load) >= 3
    first, last = s.stat[0], s.stat[-1]
    assert c["busy_share"] == round((last[0] - first[0]) / (last[1] - first[1]), 4)
    assert c["load1_max"] == max(x[0] for x in s.load)


def test_output_stops_at_its_bound() -> None:
    buf = io.StringIO()
    out = sampler.Out(200)
    with redirect_stdout(buf):
        for i in range(100):
            out.put("loadavg", f"{i} 0.00 0.01 0.05 1/100 {i}")
    text = buf.getvalue()
    assert len(text.encode()) <= 200 and out.full and text.splitlines()[-1].startswith("capped ")


def test_sampler_container_options() -> None:
    rank = {"device_requests": [{"Driver": "nvidia", "DeviceIDs": ["0", "1"], "Capabilities": [["gpu"]]}]}
    opts = sampler_options(rank, "RUN", "1n2g-fp32-bs8", 900)
    assert opts["device_requests"] == [{"Driver": "nvidia", "DeviceIDs": ["0", "1"],
                                        "Capabilities": [["gpu", "utility"]]}]
    assert opts["labels"] == {"repro.probe": "telemetry", "repro.run": "RUN", "repro.cell": "1n2g-fp32-bs8"}
    assert opts["entrypoint"] == ["python3"] and opts["command"][0] == "-c" and opts["network_mode"] == "none"
    assert "device_requests" not in sampler_options({}, "RUN", "c", 900)
    assert opts["command"][-3:] == ["1000", str(4 << 20), "1500"]  # interval, bytes, the deadline + 600 s


def test_summary_of_a_cell_over_its_repeats(tmp_path: Path) -> None:
    cell = tmp_path / "cells" / "1n1g-fp32-bs256"
    for k in (1, 2):
        d = cell / f"r{k}"
        d.mkdir(parents=True)
        rows = lines("h100-590.48.01-query-gpu-load.csv")
        (d / "telemetry-node0.txt").write_text("\n".join(["gpu " + x for x in rows]) + "\n")
        write_repeat_summary(d)
    got = summary(tmp_path, "1n1g-fp32-bs256")
    assert got is not None and sorted(got["repeats"]) == [1, 2]
    assert got["gpu"]["samples"] == 2 and got["gpu"]["below_max_share"] == 0.0
    assert json.loads((cell / "r1" / "telemetry.json").read_text())["node0"]["gpu"]["busy_samples"] == 1
    assert summary(tmp_path, "1n8g-fp32-bs256") is None


@pytest.mark.parametrize("raw", ["", "garbage", "gpu", "gpu a,b,c", "apps 1,2", "cgroup x", "stat cpu x"])
def test_junk_lines_are_skipped(raw: str) -> None:
    assert parse_stream("n", [raw]) == Stream("n", skipped=int(raw == "stat cpu x"))


def test_marked_lines_of_a_slurm_step_go_to_each_nodes_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.run import sampling

    monkeypatch.setattr(sampling, "MAX_BYTES", 0)
    monkeypatch.setattr(sampling, "SLACK", 200)  # room for a few lines
    files = sampling.TelemetryFiles(tmp_path)
    files.write("n1", "containers " + "a" * 64)
    for line in lines("h100-590.48.01-query-gpu-load.csv")[:1] * 3:
        files.write("n1", "gpu " + line[:40])
    files.write("n2", "loadavg 1.0 0.52 0.58 0.59 2/1234 5678")
    files.close()
    files.write("n2", "loadavg 2.0 9.99 0.58 0.59 2/1234 5678")  # after the step's end: dropped
    one = (tmp_path / "telemetry-n1.txt").read_text()
    assert one.startswith("containers ") and len(one) <= 200
    assert (tmp_path / "telemetry-n2.txt").read_text() == "loadavg 1.0 0.52 0.58 0.59 2/1234 5678\n"
    assert json.loads((tmp_path / "telemetry.json").read_text())["n2"]["cpu"]["load1_max"] == 0.52
