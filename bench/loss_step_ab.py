"""The training loss (mens.train.loss) of this tree against the same file at another revision, step by step.

The question it answers: does a change to the loss make a CPU training step faster, and by how much? A change of
a few percent is below what separate runs on a shared 2-core VM resolve (their step times differ by 10% from one
run to the next), so both versions run inside one training run on the same micro-batches: from the third step on,
each step's micro-batches are trained forward and backward once with each version, in alternating order, timed,
and their gradients thrown away; then the step itself trains with this tree's loss as usual. The record gives each
version's seconds per step and the paired ratio (base / this tree: above 1 means this tree is faster), with the
losses both gave on the same batches (they must agree: the change is to speed, not to the sums).

It trains dogfood's recipe (`--preset cpu`, dogfood's system prompt) on a dogfood run's training file, on the
allocator mens' training commands use (mimalloc where installed), without the validation split.

Run:  python bench/loss_step_ab.py --data RUN/data/train.jsonl --base REV [--steps 40] [--output PATH]
      (writes bench/results/loss_step_ab-<host>.json by default)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import step_ab
from machine import REPO, machine

LOSS_FILE = "src/mens/train/loss.py"


def load_base(rev: str):
    """mens.train.loss as it was at `rev`, imported as its own module (git show; nothing else of that revision)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{LOSS_FILE}"], capture_output=True, text=True,
                          check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="mens-loss-base-")) / "loss_base.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("loss_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["loss_base"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def paired_steps(data: Path, steps: int, base) -> dict:
    """step_ab's pairing with the base revision's loss as the other side; the record keeps this bench's names."""
    from mens.train import loss

    versions = {"tree": loss.supervised_loss_sum, "other": base.supervised_loss_sum}

    def switch(side: str, model=None) -> None:
        loss.supervised_loss_sum = versions[side]

    run = step_ab.paired_steps(data, steps, switch)
    return {"pairs": run["pairs"], "matmul_dtype": run["matmul_dtype"], "tree_step_s": run["tree_step_s"],
            "base_step_s": run["other_step_s"], "ratio_base_over_tree": run["ratio_other_over_tree"],
            "loss_sum_max_relative_gap": run["loss_sum_max_relative_gap"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="A dogfood run's data/train.jsonl.")
    ap.add_argument("--base", required=True, help="The git revision whose mens/train/loss.py is the baseline.")
    ap.add_argument("--steps", type=int, default=40, help="Training steps; steps 3.. are paired (default 40).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/loss_step_ab-<host>.json).")
    a = ap.parse_args()
    if not a.data.is_file():
        sys.exit(f"--data {a.data}: no such file; pass a dogfood run's data/train.jsonl")
    if a.steps < 4:
        sys.exit(f"--steps {a.steps}: expected at least 4 (the first two are not paired)")
    from mens.train.allocator import preload_env

    env = preload_env(os.environ)
    if env is not None:  # run on the training commands' allocator, as dogfood's training does
        os.execvpe(sys.executable, [sys.executable, *sys.argv], env)
    try:
        base = load_base(a.base)
    except subprocess.CalledProcessError as e:
        sys.exit(f"--base {a.base}: git show {a.base}:{LOSS_FILE} failed ({e.stderr.strip()[:200]})")
    rev = lambda name: subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", name],  # noqa: E731
                                      capture_output=True, text=True).stdout.strip()
    tree = rev("HEAD")
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", LOSS_FILE], capture_output=True,
                                text=True).stdout.strip())
    import torch

    run = paired_steps(a.data, a.steps, base)
    record = {"bench": "loss_step_ab", "machine": machine(), "allocator": os.environ.get("LD_PRELOAD", "system"),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "data": str(a.data),
              "base": rev(a.base) or a.base, "tree": tree + (" (+ uncommitted loss.py)" if dirty else ""), "run": run,
              "note": "seconds of one step's forward and backward (its micro-batches) with each loss version, on "
                      "the same batches inside one run; ratio = base / tree, so above 1 means the tree is faster"}
    out = a.output or REPO / "bench" / "results" / f"loss_step_ab-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(run["ratio_base_over_tree"]), f"loss sums agree to {run['loss_sum_max_relative_gap']:.1e}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
