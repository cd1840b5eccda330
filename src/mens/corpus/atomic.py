"""Atomic file writes: a temp file in the same directory, flushed and fsynced, renamed over the target, and the
directory fsynced. A failed write (full disk, killed process) leaves the previous file exactly as it was.

A write that fails reports one DataError naming the file and the OS reason; the temp file is removed.
Run: used by every `mens corpus` command for every file it writes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from mens.errors import DataError


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_NEW_FILE_MODE = _default_mode()
"""Mode of a newly created output (mkstemp makes 0600; outputs are ordinary files other tools read)."""


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | Path, binary: bool = False) -> Iterator[IO]:
    """Open a UTF-8 text (or binary) stream whose content replaces `path` only when the block completes."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise DataError(f"{path}: cannot create the output file: {e.strerror or e} (errno {e.errno}); "
                        "check the folder exists and is writable") from None
    tmp = Path(tmp_name)
    try:
        mode = path.stat().st_mode & 0o7777 if path.is_file() else _NEW_FILE_MODE
        kw = {} if binary else {"encoding": "utf-8", "newline": "\n"}
        with os.fdopen(fd, "wb" if binary else "w", **kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(f"{path}: writing failed: {e.strerror or e} (errno {e.errno}); the previous {path.name} "
                        "is unchanged; free space or fix permissions, then run the command again") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` atomically (see atomic_writer)."""
    with atomic_writer(path) as f:
        f.write(text)
