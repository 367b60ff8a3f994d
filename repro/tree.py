"""Directory trees walked and removed without recursion, to a bounded depth.

Log trees, run directories and unpacked archives come from anyone: a tree nested thousands of
levels deep must give a clear error (its kind says the exit status: bad input, or a run that
fails its integrity check), not a RecursionError, and what the kit unpacked must go whatever
the tree holds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from repro.errors import ReproError

#: How deep a log tree or run directory may nest (a run directory is 4 levels; published log trees under 12).
MAX_DEPTH = 32


def walk(root: Path, error: type[ReproError], *, max_depth: int = MAX_DEPTH,
         skip: Callable[[str], bool] = lambda name: False) -> Iterator[Path]:
    """Every entry under ``root`` (not ``root`` itself), each directory's entries in name order before
    what they hold; links are yielded, never followed. Names ``skip`` accepts are passed over with what
    they hold. Deeper than ``max_depth``: ``error`` naming the place."""
    stack: list[tuple[Path, int]] = [(Path(root), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not skip(e.name)), key=lambda e: e.name)
        except OSError as e:
            raise error(f"{folder}: cannot read: {e.strerror}") from None
        below = []
        for entry in entries:
            path = Path(entry.path)
            yield path
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 >= max_depth:
                    where = path.relative_to(root)
                    raise error(f"{root}: nested deeper than {max_depth} levels (at {where})",
                                hint="a log tree or run directory is a few levels deep; give the folder that "
                                     "holds the logs")
                below.append((path, depth + 1))
        stack.extend(reversed(below))


def remove(root: Path) -> None:
    """Remove ``root`` and everything under it, however deep (best effort: what cannot go stays)."""
    root = Path(root)
    if not root.exists() and not root.is_symlink():
        return
    stack = [root]
    dirs: list[Path] = []
    while stack:
        p = stack.pop()
        try:
            if stat.S_ISDIR(p.lstat().st_mode):
                dirs.append(p)
                stack.extend(Path(e.path) for e in os.scandir(p))
            else:
                p.unlink()
        except OSError:
            continue
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            continue
