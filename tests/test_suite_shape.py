"""The suite collects as one session: pytest's default import mode (rootdir-relative basenames, no packages)
refuses two test files with the same name anywhere under tests/, and the unit lane alone (which ignores
tests/integration) would not see the clash."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_files_share_a_name() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(path.relative_to(TESTS).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
