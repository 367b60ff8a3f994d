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
    """Remove ``root`` and everything under it, however deep (best effort: what cannot go stays).

    Walked through directory descriptors, one open at a time: each step costs the same at any depth,
    where a path thousands of levels long costs the kernel a lookup per level on every call."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            os.unlink(root)
            return
        fd = os.open(root, flags)
    except OSError:
        return
    down: list[tuple[str, set[str]]] = []  # each folder walked into, and what its parent could not remove
    kept: set[str] = set()  # what could not be removed in the folder ``fd`` is
    try:
        while True:
            sub = _files_removed(fd, kept)
            if sub is not None:
                try:
                    inner = os.open(sub, flags, dir_fd=fd)
                except OSError:
                    kept.add(sub)
                    continue
                os.close(fd)
                down.append((sub, kept))
                fd, kept = inner, set()
            elif down:
                outer = os.open("..", flags & ~os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = outer
                name, kept = down.pop()
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    kept.add(name)
            else:
                break
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError:
        pass


def _files_removed(fd: int, kept: set[str]) -> str | None:
    """Unlink what the folder ``fd`` holds up to its first folder, whose name is returned (None: no folder
    is left but those in ``kept``, where what could not be removed is added)."""
    with os.scandir(fd) as entries:
        for e in entries:
            if e.name in kept:
                continue
            if e.is_dir(follow_symlinks=False):
                return e.name
            try:
                os.unlink(e.name, dir_fd=fd)
            except OSError:
                kept.add(e.name)
    return None
