"""torchrun --nproc_per_node 2 on CPU (gloo) matches one process with the same global batch.

Slow (13-17 s here: two extra processes each import torch, transformers and peft).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.train.run import run_training


@pytest.mark.slow
def test_torchrun_two_processes_match_single(data_dir, tmp_path, tiny_model_dir):
    single = tmp_path / "single"
    run_training(tiny_config(data_dir, single, tiny_model_dir, max_steps=4, batch_size=4, grad_accum=1,
                             save_every=2, eval_every=2, preset="cpu", warmup_steps=20, epochs=2.0))
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "mens", "train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(tiny_model_dir),
           "--backend", "lora", "--device", "cpu", "--max-steps", "4", "--batch-size", "2", "--grad-accum", "1",
           "--save-every", "2", "--eval-every", "2", "--lora-dropout", "0", "--lr", "1e-2", "--seq-len", "96",
           "--rank", "4", "--alpha", "8", "--val-fraction", "0.1", "--min-examples", "10", "--threads", "1",
           "--system-prompt", "You write Vox.", "--preset", "cpu", "--autocast", "off"]
    done = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    a = load_file(str(single / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter_model.safetensors"))
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"torchrun x2 vs single: max abs adapter diff {diff:.2e}")
    assert diff < 1e-5, diff
    import json

    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
