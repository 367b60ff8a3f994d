"""A cell's failure as data (docker-py's ContainerError is the model): which ranks failed, where and how, and
the repeat's recorded reason taken from those fields, never from the message text."""

from __future__ import annotations

from pathlib import Path

from repro.events import Event
from repro.record import provenance
from repro.run.cell import CellFailed, CellJob, NodeResult
from repro.run.rundir import RunDir
from repro.spec.hosts import Hosts, Node
from repro.spec.manifest import find_target
from repro.up import UpResult
from repro.up.matrix import Repeats


def ranks() -> list[NodeResult]:
    ok = NodeResult("n1", "10.0.0.1", 0, "worker", ("python",), "/l/0-n1.log", exit_code=0)
    exited = NodeResult("n2", "10.0.0.2", 1, "worker", ("python",), "/l/1-n2.log", exit_code=3,
                        tail=["Traceback", "ValueError: bad"])
    lost = NodeResult("n3", "10.0.0.3", 2, "worker", ("python",), "/l/2-n3.log",
                      error="lost the node while the cell ran: EOF\nsecond line")
    return [ok, exited, lost]


def test_a_cell_failure_carries_the_failed_ranks_as_data() -> None:
    cell = find_target("torch-rn50-cpu").cells()[0]
    e = CellFailed(cell, ranks())
    assert [r.node for r in e.failed] == ["n2", "n3"]
    assert (e.node, e.rank, e.exit_code, e.error) == ("n2", 1, 3, None)
    assert e.reason == "rank 1 on n2: exit code 3; log /l/1-n2.log"
    assert str(e).splitlines() == [f"cell {cell.key} failed on 2 of 3 node(s):",
                                   "  rank 1 on n2: exit code 3; log /l/1-n2.log",
                                   "    | Traceback", "    | ValueError: bad",
                                   "  rank 2 on n3: lost the node while the cell ran: EOF", "second line; log /l/2-n3.log"]
    lost = CellFailed(cell, ranks()[2:])
    assert (lost.node, lost.exit_code, lost.error) == ("n3", None, "lost the node while the cell ran: EOF\nsecond line")
    assert lost.reason == "rank 2 on n3: lost the node while the cell ran: EOF"  # one line
    none = CellFailed(cell, ranks()[:1])  # e.g. an MPI worker's sshd that exited while the head waited
    assert none.failed == [] and none.node is None and none.reason == f"cell {cell.key} failed on 0 of 1 node(s):"


def test_a_failed_repeat_records_the_reason_its_failure_carries(tmp_path: Path) -> None:
    m = find_target("torch-rn50-cpu")
    cell = next(c for c in m.cells() if c.nodes == 1)
    hosts = Hosts((Node("n1", "10.0.0.1"),))
    run = RunDir.create(tmp_path / "runs", m, hosts, env={})
    asked: list[CellJob] = []

    def launch(job: CellJob) -> list[NodeResult]:
        asked.append(job)
        raise CellFailed(job.cell, ranks()[2:])

    events: list[Event] = []
    result = UpResult(run, m, provenance.new_record(run, m, hosts))
    assert not Repeats(result, hosts, "img", launch, events.append).run(cell, 1)
    state = run.read_state()["cells"][cell.key]["repeats"]["1"]
    assert state["status"] == "failed" and state["why"] == "rank 2 on n3: lost the node while the cell ran: EOF"
    assert len(asked) == m.retries + 1 and all(j.image == "img" and j.hosts is hosts for j in asked)
    assert [e.message for e in events if e.kind == "warn"][-1] == \
        f"{cell.key} repeat 1 attempt {len(asked)}/{len(asked)} failed: {state['why']}"
