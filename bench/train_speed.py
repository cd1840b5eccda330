"""Training throughput of the mens loop on the embedded SmolLM2-135M: LoRA vs QLoRA, packed vs unpacked.

Data: every shared-corpus Vox example as a prompt/response pair. Reports input tokens/s, supervised tokens/s
and wall time per configuration. Run: `python bench/train_speed.py [--steps N] [--threads T]`;
writes bench/results/train_speed-<host>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = [("lora", True), ("lora", False), ("qlora", True)]


def make_data(corpus: Path, out: Path) -> int:
    rows = []
    for f in sorted(corpus.rglob("*.vox")):
        if "negative" in f.parts or "mutants" in f.parts:
            continue
        text = f.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            rows.append({"prompt": f"Write the Vox program {f.stem.replace('_', ' ')}.", "response": text[:1500]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus" / "vox")
    args = ap.parse_args()
    import torch

    from mens.train.config import TrainConfig
    from mens.train.run import run_training

    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        n = make_data(args.corpus, data)
        for backend, pack in CONFIGS:
            out = Path(tmp) / f"{backend}-{pack}"
            cfg = TrainConfig(data=str(data), output_dir=str(out), model="smollm2-135m", backend=backend,
                              device="cpu", max_steps=args.steps, seq_len=args.seq_len, batch_size=2, grad_accum=2,
                              warmup_steps=0, val_fraction=0, save_every=0, eval_every=0, pack=pack,
                              num_threads=args.threads, min_examples=10)
            t0 = time.time()
            s = run_training(cfg)
            wall = time.time() - t0
            results.append({"backend": backend, "pack": pack, "steps": s["steps"], "input_tokens": s["total_tokens"],
                            "supervised_tokens": s["supervised_tokens"], "train_time_s": s["train_time_s"],
                            "tokens_per_s": s["tokens_per_s"],
                            "supervised_tokens_per_s": round(s["supervised_tokens"] / s["train_time_s"], 1),
                            "wall_time_s": round(wall, 1), "first_loss": s["first_loss"],
                            "final_loss": s["final_loss"], "peak_rss_mb": s["peak_memory"]["cpu_max_rss_mb"]})
            print(json.dumps(results[-1]), flush=True)
    doc = {"bench": "train_speed", "host": socket.gethostname(), "cpu_count": os.cpu_count(), "threads": args.threads,
           "torch": torch.__version__, "python": platform.python_version(), "examples": n, "seq_len": args.seq_len,
           "batch": "2 x accum 2", "results": results}
    dest = REPO / "bench" / "results" / f"train_speed-{socket.gethostname()}.json"
    dest.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
