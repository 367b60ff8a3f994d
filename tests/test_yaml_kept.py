"""YAML texts read again are composed once a process: the same answer, each caller its own data, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.errors import InputError
from repro.spec import schema
from repro.spec.schema import KEPT_YAML_CHARS, read_yaml


@pytest.fixture(autouse=True)
def empty() -> None:
    with schema._kept_lock:
        schema._kept.clear()


def test_a_text_read_again_is_composed_once_and_each_caller_gets_its_own_data(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("id: x\nlist: [1, 2]\n")
    first, second = read_yaml(f), read_yaml(f)
    assert second.node is first.node  # composed once
    first.data["list"].append(3)
    assert second.data == {"id": "x", "list": [1, 2]} and read_yaml(f).data == {"id": "x", "list": [1, 2]}
    assert second.line(["list"]) == 2


def test_the_file_is_read_each_time_so_a_rewrite_is_seen_at_once(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("id: x\n")
    assert read_yaml(f).data == {"id": "x"}
    f.write_text("id: y\n")  # the same size, in the same clock tick
    assert read_yaml(f).data == {"id": "y"}


def test_errors_are_raised_each_time(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("a: 1\na: 2\n")
    for _ in range(2):
        with pytest.raises(InputError, match="duplicate key"):
            read_yaml(f)


def test_what_is_kept_stays_within_its_bound(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("k: " + "x" * (KEPT_YAML_CHARS // 8) + "\n")  # over an eighth of the bound: never kept
    read_yaml(big)
    assert not schema._kept
    for i in range(40):
        f = tmp_path / f"{i}.yaml"
        f.write_text(f"i: {i}\npad: {'y' * (KEPT_YAML_CHARS // 20)}\n")
        assert read_yaml(f).data["i"] == i
    assert sum(map(len, schema._kept)) <= KEPT_YAML_CHARS
    assert 0 < len(schema._kept) < 40  # the oldest went out first
    assert any(text.startswith("i: 39\n") for text in schema._kept)


def _lines(node: object) -> list[tuple[str, int, int]]:
    """Every node of a tree in document order: its tag and where it starts."""
    import yaml

    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append((n.tag, n.start_mark.line, n.start_mark.column))
        if isinstance(n, yaml.MappingNode):
            stack.extend(x for kv in reversed(n.value) for x in reversed(kv))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(reversed(n.value))
    return out


def test_libyaml_reads_every_shipped_manifest_as_the_pure_loader_does() -> None:
    """The fast path gives the data and the line of every node that the pure-Python loader gives."""
    assert schema._FAST is not None, "PyYAML without libyaml: every manifest is read by the pure loader"
    files = sorted((Path(__file__).resolve().parents[1] / "manifests").glob("*.yaml"))
    assert len(files) > 40
    for f in files:
        text = f.read_text(encoding="utf-8")
        fast_node, fast = schema._compose_with(schema._FAST(text))
        pure_node, pure = schema._compose_with(schema.StrictLoader(text))
        assert (fast, _lines(fast_node)) == (pure, _lines(pure_node)), f.name


def test_an_alias_and_a_deep_flow_collection_go_to_the_pure_loader() -> None:
    with pytest.raises(Exception, match="alias \\*a is not allowed"):
        schema._compose("a: &a [1]\nb: *a\n")
    deep = 3 * schema._FAST_BRACKETS  # past the recursion limit; 100,000 levels would take libyaml minutes
    with pytest.raises(RecursionError):
        schema._compose("a: " + "[" * deep + "]" * deep + "\n")
