"""A tiny checkpointed run for the checkpoint-safety tests: 6 steps, checkpoints at steps 2 and 4, dropout and NEFTune
on (so resuming must restore the RNG), plus the live objects a resume checks a checkpoint against."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

from train_tiny import tiny_config

from mens.train.run import run_training  # imported here, so every forked child runs the very same code

RUN = dict(max_steps=6, save_every=2, eval_every=3, batch_size=2, grad_accum=1, lora_dropout=0.1, neftune_alpha=5.0,
           learning_rate=1e-2, warmup_steps=2, keep_checkpoints=3, epochs=2.0)
CKPT_FILES = ("adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "scheduler.json",
              "rng.safetensors", "state.json", "checksums.json")


def config(data_dir, out, model_dir, **over):
    return tiny_config(data_dir, out, model_dir, **{**RUN, **over})


def live_objects(model_dir):
    """Model (LoRA attached), optimizer and scheduler shaped like the run's, for `newest_good`."""
    import torch

    from mens.model.load import load_base
    from mens.model.lora import attach_lora
    from mens.train.schedule import make_scheduler

    torch.manual_seed(0)
    model = attach_lora(load_base(Path(model_dir), backend="lora", device="cpu"), r=4, alpha=8, dropout=0.1)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    return dict(model=model, backend="lora", optimizer=optimizer,
                scheduler=make_scheduler(optimizer, warmup=2, total=6))


def _train(cfg_kw: dict, kill_at: str | None) -> None:
    import sys

    import torch

    if kill_at:
        os.environ["MENS_TEST_KILL_AT"] = kill_at
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child's progress lines are noise here
    torch.set_num_threads(1)
    run_training(config(**cfg_kw))


def run_child(data_dir, out, model_dir, *, kill_at: str | None = None, kill_after_s: float | None = None,
              resume: bool = True, timeout_s: float = 120) -> int:
    """Train in a forked process (no re-import: fast) that may be SIGKILLed at a named point, or `kill_after_s`
    after its training starts.

    Returns its exit code (-9: killed).
    """
    kw = dict(data_dir=data_dir, out=out, model_dir=model_dir, resume=resume)
    starts = len(resumed_from(out))
    proc = multiprocessing.get_context("fork").Process(target=_train, args=(kw, kill_at))
    proc.start()
    if kill_after_s is not None:  # counted from this child's train_start event: after loading, as steps begin
        deadline = time.time() + timeout_s
        while proc.is_alive() and len(resumed_from(out)) == starts and time.time() < deadline:
            time.sleep(0.01)
        proc.join(kill_after_s)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout_s)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        raise AssertionError(f"training child still running after {timeout_s} s")
    return proc.exitcode


def train_seconds(out) -> float:
    """Seconds from the last train_start event to train_complete (the part of a run that steps and saves)."""
    from mens.train.telemetry import read_events

    ts = {e["event"]: e["ts_ms"] for e in read_events(out)}
    return (ts["train_complete"] - ts["train_start"]) / 1000


def resumed_from(out) -> list:
    from mens.train.telemetry import read_events

    return [e.get("resumed_from_step") for e in read_events(out) if e["event"] == "train_start"]


def assert_same_adapter(run, ref) -> None:
    """Bit-identical adapter tensors (not file bytes: safetensors orders header metadata by a hash map)."""
    import torch
    from safetensors.torch import load_file

    a, b = (load_file(str(Path(r) / "adapter_model.safetensors")) for r in (run, ref))
    assert a.keys() == b.keys()
    differ = sorted(k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k]))
    assert not differ, f"{len(differ)} adapter tensors differ from the uninterrupted run, e.g. {differ[0]}"
