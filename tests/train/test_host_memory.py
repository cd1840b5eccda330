"""host_memory: `host_memory: lean` fixes glibc's mmap threshold through mallopt, and only where it can."""

from __future__ import annotations

import ctypes
import sys

import pytest

from mens.train import host_memory
from mens.train.config import TrainConfig


class _Libc:
    def __init__(self, ok: int = 1):
        self.calls: list[tuple[int, int]] = []
        self.ok = ok
        outer = self

        class _Fn:
            argtypes = restype = None

            def __call__(self, param, value):
                outer.calls.append((param, value))
                return outer.ok

        self.mallopt = _Fn()


def test_lean_fixes_the_threshold_through_mallopt(monkeypatch):
    libc = _Libc()
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    note = host_memory.fix_mmap_threshold()
    assert libc.calls == [(host_memory.M_MMAP_THRESHOLD, 1 << 20)]
    assert "1024 KiB" in note


def test_a_users_own_setting_wins_and_other_platforms_are_left_alone(monkeypatch):
    libc = _Libc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert "65536" in host_memory.fix_mmap_threshold() and libc.calls == []
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert host_memory.fix_mmap_threshold() is None and libc.calls == []


def test_a_c_library_without_mallopt_changes_nothing(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # no mallopt attribute (musl)
    assert host_memory.fix_mmap_threshold() is None
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Libc(ok=0))  # mallopt refused the value
    assert host_memory.fix_mmap_threshold() is None


def test_the_setting_is_validated(tmp_path):
    assert TrainConfig(data=str(tmp_path), output_dir=str(tmp_path / "o")).host_memory == "fast"
    with pytest.raises(Exception, match="host_memory"):
        TrainConfig(data=str(tmp_path), output_dir=str(tmp_path / "o"), host_memory="tiny")


def test_the_preflight_note_names_the_allocator_and_what_lean_did():
    assert host_memory.host_memory_note("fast", "mimalloc", None).startswith("mimalloc")
    lean = host_memory.host_memory_note("lean", "mimalloc", None)
    assert lean.startswith("mimalloc") and "glibc" in lean  # lean is not applied on mimalloc, and the note says so
    assert host_memory.host_memory_note("lean", "system", "glibc mmap threshold fixed") == "glibc mmap threshold fixed"
    assert "no mallopt" in host_memory.host_memory_note("lean", "system", None)
    assert host_memory.host_memory_note("fast", "system", None).startswith("the C library's malloc")
