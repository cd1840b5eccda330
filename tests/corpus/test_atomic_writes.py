"""A full disk (ENOSPC injected into the file writes) during any corpus write leaves the previous output intact,
removes its temp file, says so in one line, and a re-run afterwards loses no row."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hostile_inputs import GOOD_CODE, run_cli, write_jsonl_faults

BUDGETS = [0, 1, 300]
"""Bytes a command may write in total before the disk is 'full' (mid-line, mid-file)."""


class _FullDisk:
    """Wraps a file object; raises ENOSPC once more than `budget` bytes have been written through any wrapper."""

    def __init__(self, f, state: dict):
        self._f, self._state = f, state

    def write(self, data):
        self._state["left"] -= len(data)
        if self._state["left"] < 0:
            self._state["hits"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


@pytest.fixture
def full_disk(monkeypatch):
    """Call with a byte budget to make every later `os.fdopen` file fail with ENOSPC past it."""
    state = {"left": 0, "hits": 0}
    real = os.fdopen

    def arm(budget: int) -> dict:
        state["left"] = budget
        monkeypatch.setattr(os, "fdopen", lambda *a, **k: _FullDisk(real(*a, **k), state))
        return state

    yield arm
    monkeypatch.setattr(os, "fdopen", real)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _commands(tmp_path: Path) -> dict[str, list]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.vox").write_text(GOOD_CODE)
    (src / "b.md").write_text(f"# B\n\nAdds.\n\n```vox\n{GOOD_CODE.replace('add', 'plus')}```\n")
    inp = write_jsonl_faults(tmp_path / "in.jsonl", ["malformed", "lone_surrogate"], good=3)
    (tmp_path / "mix.yaml").write_text("sources:\n  - {path: in.jsonl, weight: 2}\noutput: out/mixed.jsonl\n")
    out = tmp_path / "out"
    return {
        "extract": ["corpus", "extract", src, "-o", out / "units.jsonl"],
        "validate": ["corpus", "validate", inp, "-o", out / "v.jsonl", "--report", out / "v.report.json"],
        "pairs": ["corpus", "pairs", inp, "-o", out / "t.jsonl"],
        "mix": ["corpus", "mix", "-c", tmp_path / "mix.yaml", "--base", tmp_path],
        "eval": ["corpus", "eval", inp, "-o", out / "e.json"],
        "generate": ["corpus", "generate", "-n", "5", "-o", out / "g.jsonl"],
        "requests": ["corpus", "requests", "-o", out / "r.jsonl"],
    }


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("command", ["extract", "validate", "pairs", "mix", "eval", "generate", "requests"])
def test_full_disk_keeps_previous_output(tmp_path: Path, capsys, full_disk, command: str, budget: int):
    args = _commands(tmp_path)[command]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0, out
    before = _snapshot(tmp_path / "out")
    state = full_disk(budget)
    code, out, _ = run_cli(capsys, *args)
    assert state["hits"] >= 1 and code == 2 and "Traceback" not in out
    assert "No space left on device" in out and "is unchanged" in out and len(out.strip().splitlines()) == 1
    assert _snapshot(tmp_path / "out") == before  # every file as it was; no temp file left behind


def test_extract_rerun_after_full_disk_loses_no_unit(tmp_path: Path, capsys, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.vox").write_text(GOOD_CODE)
    out = tmp_path / "units.jsonl"
    assert run_cli(capsys, "corpus", "extract", src, "-o", out)[0] == 0
    first = out.read_bytes()
    (src / "b.vox").write_text(GOOD_CODE.replace("add", "plus"))
    real, state = os.fdopen, {"left": len(first) + 10, "hits": 0}
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _FullDisk(real(*a, **k), state))
    code, text, _ = run_cli(capsys, "corpus", "extract", src, "-o", out)
    assert code == 2 and state["hits"] == 1 and out.read_bytes() == first
    monkeypatch.setattr(os, "fdopen", real)
    assert run_cli(capsys, "corpus", "extract", src, "-o", out)[0] == 0
    names = sorted(line for line in out.read_text().splitlines())
    assert len(names) == 2 and out.read_bytes().startswith(first)  # old rows first, the new unit after


def test_extract_moves_a_torn_last_line_to_rejects(tmp_path: Path, capsys):
    """An output left torn by an older, appending extract: the torn line is a reject, not glued to a new unit."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.vox").write_text(GOOD_CODE)
    out = tmp_path / "units.jsonl"
    run_cli(capsys, "corpus", "extract", src, "-o", out)
    good = out.read_bytes()
    out.write_bytes(good + b'{"kind": "file", "code": "fn torn(')  # no newline: a write cut short
    (src / "b.vox").write_text(GOOD_CODE.replace("add", "plus"))
    code, text, _ = run_cli(capsys, "corpus", "extract", src, "-o", out)
    assert code == 0, text
    rows = out.read_text().splitlines()
    assert out.read_bytes().startswith(good) and len(rows) == 2 and "plus" in rows[1]
    rejects = (tmp_path / "units.rejects.jsonl").read_text()
    assert '"reason":"malformed_json"' in rejects and "units.jsonl:2" in rejects and "fn torn(" in rejects
