"""Finding and reading extract's input files safely: no symlink escapes or loops, no special files, a size cap,
UTF-8 text only. Every file that is not read is reported with a reason instead.

Symlinks under an input folder are followed only when they resolve to a regular file inside that folder;
symlinked folders are never walked (their targets inside the folder are walked anyway).
Run: used by `mens corpus extract` and `mens corpus pairs --docs`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mens.corpus.limits import MAX_SOURCE_FILE_BYTES
from mens.errors import UsageError

SKIP_DIRS = {".git", "node_modules", "target", ".venv", "__pycache__", ".vox", "vox-vscode"}


@dataclass(frozen=True)
class SkippedFile:
    """A file (or link) under an input that was not read, and why (`code: detail`)."""

    source: str
    reason: str


def _symlink_target(path: Path, root: Path) -> Path | str:
    """The resolved target of a symlink inside `root`, or the reason it is refused."""
    try:
        target = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a loop this way
        return "symlink_loop: the link resolves to itself"
    except OSError as e:
        if e.errno == 40:  # ELOOP
            return "symlink_loop: the link resolves to itself"
        return f"symlink_broken: target {os.readlink(path)!r} does not exist"
    if not target.is_relative_to(root):
        return f"symlink_outside_input: points to {target}, outside {root}; copy the file in if it belongs"
    if target.is_dir():
        return "symlink_dir: symlinked folders are not walked (a target inside the input is walked there)"
    return target


def _walk(root: Path, exts: tuple[str, ...], skipped: list[SkippedFile]) -> list[tuple[Path, str]]:
    out: list[tuple[Path, str]] = []
    real_root = root.resolve()
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(dirs + files):
            path = here / name
            rel = path.relative_to(root).as_posix()
            source = f"{root.name}/{rel}" if root.name else rel
            if path.is_symlink():
                target = _symlink_target(path, real_root)
                if isinstance(target, str):
                    skipped.append(SkippedFile(source, target))
                    continue
                if name.endswith(exts):
                    out.append((target, source))
            elif name in files and name.endswith(exts):
                out.append((path, source))
    return out


def collect_files(paths: list[Path], exts: tuple[str, ...],
                  skipped: list[SkippedFile] | None = None) -> list[tuple[Path, str]]:
    """(file, source label) for every file ending in `exts` under `paths`; refused links go to `skipped`."""
    out: list[tuple[Path, str]] = []
    skipped = [] if skipped is None else skipped
    for root in paths:
        if root.is_file():
            out.append((root, str(root)))
        elif root.is_dir():
            out.extend(_walk(root, exts, skipped))
        else:
            raise UsageError(f"{root}: no such file or folder; pass source files ({', '.join(exts)}) "
                             "or folders that contain them (or no PATH for the embedded corpus)")
    return out


class _Refused(Exception):
    """A file that is not read; the message is the reason."""


def read_source(path: Path, limit: int = MAX_SOURCE_FILE_BYTES) -> tuple[str | None, str]:
    """(UTF-8 text, "") or (None, reason `code: detail` naming the limit or the fault); never raises."""
    text, reason = None, ""
    try:
        text = _read_text(path, limit)
    except _Refused as e:
        reason = str(e)
    return text, reason


def _read_text(path: Path, limit: int) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise _Refused(f"unreadable: {e.strerror or e} (expected UTF-8 text; fix or remove the file)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("not_regular_file: a device, pipe or socket is not a source file")
        if st.st_size > limit:
            raise _Refused(f"file_too_large: {st.st_size} bytes > {limit} allowed; split the file")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise _Refused(f"unreadable: {e.strerror or e} (expected UTF-8 text; fix or remove the file)") from None
    if len(data) > limit:
        raise _Refused(f"file_too_large: more than {limit} bytes (it grew while read); split the file")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise _Refused(f"binary_file: NUL byte at offset {nul} (expected UTF-8 text)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Refused(f"not_utf8: invalid byte 0x{data[e.start]:02x} at offset {e.start} (expected UTF-8 text; "
                       "fix or remove the file)") from None
