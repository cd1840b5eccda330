"""bench/train_speed.py: which allocator each run gets (mens as `mens train` runs, TRL as its users run it, and
the -system / -mimalloc arms that separate the allocator from the rest)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mens.train import allocator

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

ts = pytest.importorskip("train_speed")
installed = pytest.mark.skipif(allocator.preload_env({}) is None,
                               reason="mens trains on the C library's malloc here (not Linux, no cmeel-mimalloc, or "
                                      "an NVIDIA driver)")


@installed
def test_mens_runs_on_mimalloc_and_trl_as_its_users_run_it():
    env = {"PATH": "/bin", allocator.CHOICE: "system"}  # the bench's own setting never leaks into a run
    mens = ts.run_env("mens-qlora-packed", env)
    assert "libmimalloc" in mens["LD_PRELOAD"] and mens["MIMALLOC_PURGE_DELAY"] == "-1"
    assert "LD_PRELOAD" not in ts.run_env("trl-qlora-packed", env)
    assert "libmimalloc" in ts.run_env("trl-lora-mimalloc", env)["LD_PRELOAD"]


def test_system_and_lean_runs_stay_on_the_c_library():
    for name in ("mens-lora-system", "mens-qlora-lean"):
        env = ts.run_env(name, {"PATH": "/bin"})
        assert env[allocator.CHOICE] == "system" and "LD_PRELOAD" not in env


def test_every_pair_names_known_runs():
    assert all(m in ts.RUNS and t in ts.RUNS and ts.RUNS[m][0] == "mens" and ts.RUNS[t][0] == "trl"
               for m, t in ts.PAIRS)
