"""Durable writes for files a later step trusts: write beside the target, fsync the data, rename, fsync the directory.

A crash (power loss, SIGKILL, full disk) then leaves either the old file/directory or the new one, never a mix.
`kill_point` is a test-only hook: MENS_TEST_KILL_AT=<point>@<step> SIGKILLs the process at that point, so tests
can crash a run inside a checkpoint write. Not protected against: a disk that lies about fsync, or a directory
shared with another writer.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

KILL_ENV = "MENS_TEST_KILL_AT"


def kill_point(name: str, step: int) -> None:
    """SIGKILL this process when MENS_TEST_KILL_AT is `name@step` (read on each call, so a forked child can set it)."""
    if os.environ.get(KILL_ENV) == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a rename, a new file) durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory, deepest first."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            fsync_file(Path(dirpath) / f)
        fsync_dir(Path(dirpath))


def write_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` inside a temporary directory; `replace_dir` / `publish_files` fsync it before renaming.

    The one place checkpoint state bytes reach the disk (tests inject a full disk here).
    """
    with open(path, "wb") as f:
        f.write(data)


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the fully written directory `tmp` at `final`, replacing what was there, durably.

    The old directory is renamed aside first and deleted only after the new one is in place.
    """
    fsync_tree(tmp)
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def publish_files(tmp: Path, dest: Path, last: tuple[str, ...] = ()) -> list[str]:
    """Move every file of the fully written directory `tmp` into `dest` (each by one atomic rename), then remove `tmp`.

    Files named in `last` move last: a reader that checks for them (a config file) sees the set only when complete.
    """
    fsync_tree(tmp)
    names = sorted(p.name for p in tmp.iterdir() if p.is_file())
    names.sort(key=lambda n: n in last)  # stable: the others keep their order
    for name in names:
        os.replace(tmp / name, dest / name)
    fsync_dir(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return names
