"""The original's headline job on one GPU: `mens train --preset qwen_4080_16g` on a Qwen3.5-4B-shaped model, with the
training process held to a 16 GB card's memory.

The model is built from Qwen3.5-4B's text config with random weights (no download; speed and memory do not depend
on the weights) and the bench's byte-level tokenizer; the data are synthetic prompt/answer rows (gpu_train_runs).
The cap is torch's own (`torch.cuda.set_per_process_memory_fraction`): an allocation past it fails as out of memory,
so "fits a 16 GB card" is shown, not estimated. The cap leaves a 16 GiB card's CUDA context and driver reserve
outside it (--cap-gib, default 15). Beside the measured peak the record keeps `mens probe`'s estimate for the same
model and preset, and what the run chose (packing mode, gradient checkpointing, adapted modules).
Run: `python bench/gpu_headline.py [--tiny --device cpu] [--steps N] [--out FILE]`; `--tiny` runs the same path on
CPU in seconds (CI). Writes bench/results/gpu_headline-<host>.json unless --out names another file.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_train_runs as runs  # noqa: E402
from machine import commit, machine  # noqa: E402

# Qwen3.5-4B's text model (its config.json's text_config): 8 x (3 Gated-DeltaNet layers + 1 gated full attention).
QWEN35_4B = {"model_type": "qwen3_5_text", "hidden_size": 2560, "intermediate_size": 9216, "num_hidden_layers": 32,
             "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320,
             "tie_word_embeddings": True, "max_position_embeddings": 262144, "linear_num_key_heads": 16,
             "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_conv_kernel_dim": 4, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8,
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024, "linear_num_key_heads": 2,
        "linear_num_value_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
PRESET = "qwen_4080_16g"


def build(out: Path, tiny: bool, device: str) -> dict:
    """Save the random-weight model (bf16 on CUDA) and the byte-level tokenizer; runs in its own process so the
    training process starts with nothing allocated."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**{**QWEN35_4B, **(TINY if tiny else {})})
    model = runs.save_random_model(cfg, device, out)
    meta = {"params": sum(p.numel() for p in model.parameters()), "matmul_params": runs.matmul_params(model),
            "model_type": cfg.model_type}
    (out / "bench_meta.json").write_text(json.dumps(meta))
    return meta


def train(a, model_dir: Path, data: Path, run_dir: Path) -> dict:
    """`mens train` through its CLI entry point in this process, under the memory cap; the measured peaks."""
    import torch

    from mens.cli.main import main as mens_main

    cap = None
    if a.device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        cap = min(1.0, a.cap_gib * 2**30 / total)
        torch.cuda.set_per_process_memory_fraction(cap)
        torch.cuda.reset_peak_memory_stats()
    argv = ["train", "--model", str(model_dir), "--preset", PRESET, "--data", str(data), "--output-dir",
            str(run_dir), "--device", a.device, "--max-steps", str(a.steps), "--system-prompt", "",
            "--save-every", "0", "--max-time-s", str(a.max_time_s), "--log-every-s", "10"]
    if a.device == "cpu":
        argv += ["--threads", "2"]
    t0, code = time.time(), 0
    try:
        mens_main(argv)
    except SystemExit as e:  # the CLI exits non-zero on a MensError, with its one-line message already printed
        code = e.code if isinstance(e.code, int) else 1
    out = {"argv": ["mens", *argv], "exit_code": code, "wall_s": round(time.time() - t0, 1)}
    if a.device == "cuda":
        free, total = torch.cuda.mem_get_info()
        out.update(cap_fraction=round(cap, 4), cap_mb=round(cap * total / 2**20),
                   peak_allocated_mb=round(torch.cuda.max_memory_allocated() / 2**20, 1),
                   peak_reserved_mb=round(torch.cuda.max_memory_reserved() / 2**20, 1),
                   # memory the process holds outside torch's allocator (CUDA context, cuBLAS/cuDNN handles)
                   outside_allocator_mb=round((total - free - torch.cuda.memory_reserved()) / 2**20, 1))
        out["peak_device_mb_estimate"] = round(out["peak_reserved_mb"] + out["outside_allocator_mb"], 1)
    return out


def run_facts(run_dir: Path) -> dict:
    """What the run chose and measured, from its own files (manifest and summary)."""
    from mens.run_records import MANIFEST, SUMMARY

    facts: dict = {}
    if (run_dir / MANIFEST).is_file():
        m = json.loads((run_dir / MANIFEST).read_text())
        ad = m.get("adapter") or {}
        facts.update(packing=m.get("packing"), gradient_checkpointing=m.get("gradient_checkpointing"),
                     matmul_dtype=m.get("matmul_dtype"), plan=m.get("steps"),
                     adapted_modules=len(ad.get("modules") or []),
                     adapter={k: v for k, v in ad.items() if k not in ("modules", "parameters")},
                     config={k: m["config"].get(k) for k in ("backend", "r", "lora_alpha", "lora_dropout", "seq_len",
                                                             "batch_size", "grad_accum", "learning_rate", "pack")})
    if (run_dir / SUMMARY).is_file():
        s = json.loads((run_dir / SUMMARY).read_text())
        facts.update({k: s.get(k) for k in ("steps", "first_loss", "final_loss", "train_time_s", "tokens_per_s",
                                            "total_tokens", "supervised_tokens", "peak_memory", "stopped_early")})
    return facts


def probe_estimate(model_dir: Path) -> dict:
    """`mens probe`'s memory estimate for this model with the preset on a 16 GB card (config only)."""
    from mens.train.probe import card_table

    cfg = json.loads((model_dir / "config.json").read_text())
    return next((row for row in card_table(cfg) if row["card_gb"] == 16), {})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (CPU, seconds)")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps (the preset's global batch is 8 rows)")
    ap.add_argument("--max-time-s", type=float, default=150.0, help="mens' own time limit on the training loop")
    ap.add_argument("--cap-gib", type=float, default=15.0, help="torch allocator cap (GiB) for the training process")
    ap.add_argument("--workdir", type=Path, help="keep the model and run here (default: a temporary directory)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--build", type=Path, help=argparse.SUPPRESS)  # internal: build the model into this directory
    a = ap.parse_args(argv)
    if a.build:
        print(json.dumps(build(a.build, a.tiny, a.device)), flush=True)
        return 0
    out = a.out or REPO / "bench" / "results" / f"gpu_headline{'-tiny' if a.tiny else ''}-{socket.gethostname()}.json"
    with tempfile.TemporaryDirectory() as tmp:
        root = a.workdir or Path(tmp)
        model_dir, data, run_dir = root / "qwen3.5-4b", root / "train.jsonl", root / "run"
        t0 = time.time()
        cmd = [sys.executable, __file__, "--build", str(model_dir), "--device", a.device] + (["--tiny"] if a.tiny
                                                                                           else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        subprocess.run(cmd, check=True, env=env)
        meta = json.loads((model_dir / "bench_meta.json").read_text())
        build_s = round(time.time() - t0, 1)
        # examples longer than a row on average: most rows (one example each on Qwen3.5) are full at 384 tokens
        runs.write_data(data, n_examples=a.steps * 8 * 2 + 40, seq_len=384 * 4, seed=42)
        doc = {"bench": "gpu_headline", "commit": commit(), "machine": machine(), "gpu": None, "preset": PRESET,
               "model": {"shape": "qwen3.5-4b" + ("-tiny" if a.tiny else ""), **meta, "build_s": build_s},
               "probe_estimate_16gb": probe_estimate(model_dir), "cap_gib": a.cap_gib if a.device == "cuda" else None}
        doc["train"] = train(a, model_dir, data, run_dir)
        doc["run"] = run_facts(run_dir)
        if a.device == "cuda":
            from machine import gpu

            doc["gpu"] = gpu()
            doc["fits_16gb"] = doc["train"]["exit_code"] == 0 and doc["train"]["peak_device_mb_estimate"] < 16 * 1024
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("train", "run", "probe_estimate_16gb")}, indent=1), f"\nwrote {out}")
    return doc["train"]["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
