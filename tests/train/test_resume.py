"""Exact resume: a CLI run SIGKILLed after its step-5 checkpoint and resumed ends with the same adapter as an
uninterrupted run (dropout and NEFTune noise on, so the RNG state must be restored too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.train import allocator
from mens.train.checkpoint import list_checkpoints
from mens.train.run import run_training
from mens.train.telemetry import read_events

FLAGS = dict(max_steps=10, batch_size=2, grad_accum=2, save_every=5, eval_every=4, lora_dropout=0.1,
             neftune_alpha=5.0, learning_rate=1e-2, warmup_steps=20)


def _cli(data_dir, out, model_dir, *extra):
    return [sys.executable, "-m", "mens", "train", "--data-dir", str(data_dir), "--output-dir", str(out),
            "--model", str(model_dir), "--backend", "lora", "--device", "cpu", "--max-steps", "10",
            "--batch-size", "2", "--grad-accum", "2", "--save-every", "5", "--eval-every", "4",
            "--lora-dropout", "0.1", "--neftune-alpha", "5", "--lr", "1e-2", "--seq-len", "96", "--rank", "4",
            "--alpha", "8", "--val-fraction", "0.1", "--min-examples", "10", "--threads", "1", "--seed", "42",
            "--system-prompt", "You write Vox.", "--preset", "cpu", "--autocast", "off", "--lora-plus-ratio", "1",
            *extra]


def test_sigkill_then_resume_matches_uninterrupted(data_dir, tmp_path, tiny_model_dir):
    ref = tmp_path / "ref"
    # same as the CLI, whose cpu preset also orders the second pass (data.second_pass): 10 steps end inside it
    run_training(tiny_config(data_dir, ref, tiny_model_dir, **FLAGS, preset="cpu", epochs=2.0, second_pass="hardest"))

    out = tmp_path / "killed"
    env = dict(os.environ, MENS_TRAIN_PAUSE_AFTER_STEP="5", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(_cli(data_dir, out, tiny_model_dir), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (out / "checkpoints" / "step-5" / "state.json").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "no step-5 checkpoint within 120 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "adapter_model.safetensors").exists()
    assert [p.name for p in list_checkpoints(out)] == ["step-5"]

    done = subprocess.run(_cli(data_dir, out, tiny_model_dir, "--resume"), env=dict(os.environ, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    starts = [e for e in read_events(out) if e["event"] == "train_start"]
    assert [e["resumed_from_step"] for e in starts] == [None, 5]
    assert [e["step"] for e in read_events(out) if e["event"] == "step"][-5:] == [6, 7, 8, 9, 10]
    assert [e["event"] for e in read_events(ref)].count("second_pass") == 1
    assert [e["event"] for e in read_events(out)].count("second_pass") == 1  # ordered after the resume, the same
    a = load_file(str(ref / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"resume vs uninterrupted: max abs adapter diff {diff:.2e}")
    assert diff <= 1e-6, diff
    # The CLI runs re-executed themselves on mimalloc (mens.train.allocator) while the reference ran in this process on
    # the C library's malloc: the allocator does not change what is learned.
    if allocator.preload_env(os.environ) is not None:  # Linux, the library installed, no NVIDIA driver
        checks = {c["check"]: c["detail"] for c in json.loads((out / "training-preflight.json").read_text())["checks"]}
        assert checks["host memory"].startswith("mimalloc"), checks["host memory"]
