"""Training commands re-execute themselves with mimalloc preloaded (mens.train.allocator): when, with what environment,
and that the re-executed process hands its children the environment they would have had."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mens.train import allocator

LIB = Path("/opt/lib/libmimalloc.so")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")


@linux_only
def test_preload_env_prepends_the_library_and_keeps_freed_pages():
    env = allocator.preload_env({"PATH": "/bin", "LD_PRELOAD": "/x/libfoo.so"}, lib=LIB, gpu_driver=False)
    assert env["LD_PRELOAD"] == f"{LIB}:/x/libfoo.so"
    assert env["MIMALLOC_PURGE_DELAY"] == "-1"
    assert env[allocator.PRELOADED] == "/x/libfoo.so"  # what the children get back
    assert env["PATH"] == "/bin"
    own = allocator.preload_env({"MIMALLOC_PURGE_DELAY": "10"}, lib=LIB, gpu_driver=False)
    assert own["MIMALLOC_PURGE_DELAY"] == "10" and own["LD_PRELOAD"] == str(LIB)  # the user's setting wins


@linux_only
@pytest.mark.parametrize("environ", [
    {allocator.PRELOADED: ""},  # already re-executed: never a loop
    {"MENS_ALLOCATOR": "system"},
    {"MENS_ALLOCATOR": "jemalloc"},  # not ours to guess (the CLI refuses it, test below)
    {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},  # the user's own allocator
    {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4:/x/libfoo.so"},
])
def test_preload_env_leaves_the_process_alone(environ):
    assert allocator.preload_env(environ, lib=LIB, gpu_driver=False) is None


@linux_only
def test_auto_stays_on_the_c_library_where_an_nvidia_driver_is_loaded():
    assert allocator.preload_env({}, lib=LIB, gpu_driver=True) is None
    assert allocator.preload_env({"MENS_ALLOCATOR": "auto"}, lib=LIB, gpu_driver=True) is None
    asked = allocator.preload_env({"MENS_ALLOCATOR": "mimalloc"}, lib=LIB, gpu_driver=True)
    assert asked["LD_PRELOAD"] == str(LIB)


def test_preload_env_without_the_library_or_off_linux(monkeypatch):
    monkeypatch.setattr(allocator, "library", lambda: None)
    assert allocator.preload_env({}, gpu_driver=False) is None
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator.preload_env({}, lib=LIB, gpu_driver=False) is None


def test_choice_problem_names_the_value_and_the_choices():
    for ok in ({}, {"MENS_ALLOCATOR": " System "}, {"MENS_ALLOCATOR": "auto"}, {"MENS_ALLOCATOR": ""}):
        assert allocator.choice_problem(ok) is None
    msg = allocator.choice_problem({"MENS_ALLOCATOR": "jemalloc"})
    assert "MENS_ALLOCATOR='jemalloc'" in msg and all(c in msg for c in allocator.CHOICES)


def test_settle_gives_children_the_parents_preload():
    env = {"LD_PRELOAD": f"{LIB}:/x/libfoo.so", allocator.PRELOADED: "/x/libfoo.so"}
    allocator.settle(env)
    assert env == {"LD_PRELOAD": "/x/libfoo.so"}
    env = {"LD_PRELOAD": str(LIB), allocator.PRELOADED: ""}
    allocator.settle(env)
    assert env == {}
    env = {"LD_PRELOAD": "/x/libfoo.so"}  # not re-executed: untouched
    allocator.settle(env)
    assert env == {"LD_PRELOAD": "/x/libfoo.so"}


def test_cli_refuses_an_unknown_allocator_before_training():
    env = {k: v for k, v in os.environ.items() if k != allocator.PRELOADED}
    done = subprocess.run([sys.executable, "-m", "mens", "train", "--data-dir", "nowhere"], capture_output=True,
                          text=True, timeout=60, env={**env, "MENS_ALLOCATOR": "jemalloc"})
    assert done.returncode == 2
    assert "MENS_ALLOCATOR='jemalloc'" in done.stderr and "Traceback" not in done.stderr


@linux_only
def test_in_use_reads_the_process_maps():
    code = "from mens.train import allocator; print(allocator.in_use())"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert plain.stdout.strip() == "system"
    lib = allocator.library()
    if lib is None:
        pytest.skip("cmeel-mimalloc is not installed")
    pre = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LD_PRELOAD": str(lib)})
    assert pre.stdout.strip() == "mimalloc", pre.stderr


def test_the_command_line_started_again_keeps_the_interpreters_options(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-u", "-m", "mens", "train", "--x"], raising=False)
    assert allocator.command_line(["train", "--x"]) == [sys.executable, "-u", "-m", "mens", "train", "--x"]
    monkeypatch.setattr(sys, "orig_argv", [], raising=False)
    assert allocator.command_line(["dogfood"]) == [sys.executable, "-m", "mens", "dogfood"]
