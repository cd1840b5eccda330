"""Two settings of one module-level knob of mens, step by step inside one training run.

The question it answers: does a setting make a CPU training step faster, and by how much? A change of a few
percent is below what separate runs on a shared 2-core VM resolve (their step times differ by 10% from one run to
the next), so both settings run inside one training run on the same micro-batches: from the third step on, each
step's micro-batches are trained forward and backward once with each setting, in alternating order, timed, and
their gradients thrown away; then the step itself trains with the tree's setting as usual. The record gives each
setting's seconds per step and the paired ratio (other / tree: above 1 means the tree's setting is faster), with
the losses both gave on the same batches (a setting meant to change only speed must agree closely).

It trains dogfood's recipe (`--preset cpu`, dogfood's system prompt) on a dogfood run's training file, on the
allocator mens' training commands use (mimalloc where installed), without the validation split.
`bench/loss_step_ab.py` runs the same pairing with another revision's loss file as the other side.

Run:  python bench/step_ab.py --data RUN/data/train.jsonl --knob MODULE:NAME=VALUE [--steps 40] [--output PATH]
      e.g. --knob mens.train.segment_attention:F32_ATTENTION_MAX_TOKENS=0
      or   --knob mens.train.bf16_base:BF16_BASE=off (bound once per run: its other side swaps the weights)
      (writes bench/results/step_ab-<host>.json by default)
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine import REPO, machine


def paired_steps(data: Path, steps: int, switch: Callable[..., None]) -> dict:
    """Train `steps` steps of dogfood's recipe; from the third, each step's micro-batches run once as "tree" and
    once as "other" (`switch(name, model)` makes that side current; after the run, `switch("tree", None)`) before
    the step trains as "tree"."""
    from mens.dogfood.pipeline import SHORT_SYSTEM_PROMPT
    from mens.train import loop
    from mens.train.resolve import resolve_config
    from mens.train.run import autocast_dtype, run_training

    out = Path(tempfile.mkdtemp(prefix="mens-step-ab-")) / "run"
    tc = resolve_config(overrides={"eval.val_fraction": 0.0},
                        flags={"data": str(data), "output_dir": str(out), "model": "smollm2-135m", "device": "cpu",
                               "seed": 0, "system_prompt": SHORT_SYSTEM_PROMPT})
    tc.max_steps, tc.eval_every, tc.save_every, tc.log_every_s = steps, 0, 0, 3600.0
    seconds: dict[str, list[float]] = {"tree": [], "other": []}
    sums: dict[str, list[float]] = {"tree": [], "other": []}
    accumulate, calls = loop.accumulate_gradients, [0]

    def paired(model, micro, *args, **kwargs):
        calls[0] += 1
        if calls[0] >= 3:  # the first two steps allocate and warm up
            params = [p for p in model.parameters() if p.requires_grad]
            grads = [p.grad for p in params]
            for name in ("tree", "other") if calls[0] % 2 else ("other", "tree"):
                switch(name, model)
                for p in params:
                    p.grad = None
                t0 = time.perf_counter()
                sums[name].append(accumulate(model, micro, *args, **kwargs))
                seconds[name].append(time.perf_counter() - t0)
            switch("tree", model)
            for p, g in zip(params, grads, strict=True):
                p.grad = g
        return accumulate(model, micro, *args, **kwargs)

    loop.accumulate_gradients = paired
    try:
        run_training(tc)
    finally:
        loop.accumulate_gradients = accumulate
        switch("tree", None)
    ratios = [o / t for o, t in zip(seconds["other"], seconds["tree"], strict=True)]
    gap = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(sums["tree"], sums["other"], strict=True))
    return {"pairs": len(ratios), "matmul_dtype": autocast_dtype(tc.autocast, "cpu", "lora") or "f32",
            **{f"{name}_step_s": {"median": round(statistics.median(v), 3), "mean": round(statistics.mean(v), 3)}
               for name, v in seconds.items()},
            "ratio_other_over_tree": {"median": round(statistics.median(ratios), 4),
                                      "mean": round(statistics.mean(ratios), 4),
                                      "stdev": round(statistics.stdev(ratios), 4) if len(ratios) > 1 else None,
                                      "min": round(min(ratios), 4), "max": round(max(ratios), 4)},
            "loss_sum_max_relative_gap": gap}


def parse_knob(text: str) -> tuple[str, str, object]:
    """`MODULE:NAME=VALUE` -> (module, name, value); VALUE is a Python literal (a number, a string in quotes)."""
    target, sep, raw = text.partition("=")
    module, colon, name = target.partition(":")
    if not (sep and colon and module and name.isidentifier()):
        raise ValueError(f"--knob {text!r}: expected MODULE:NAME=VALUE, e.g. "
                         "mens.train.segment_attention:F32_ATTENTION_MAX_TOKENS=0")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word: the string itself
    return module, name, value


def knob_switch(module_name: str, name: str, value) -> tuple[Callable[..., None], object]:
    """The switch between the tree's value of `module_name.name` ("tree") and `value` ("other"), and the tree's."""
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise ValueError(f"{module_name} has no {name}")
    tree = getattr(module, name)
    if (module_name, name) == ("mens.train.bf16_base", "BF16_BASE"):
        if (tree, value) != ("auto", "off"):
            raise ValueError(f"{module_name}:{name}: compared as the tree's 'auto' against 'off' only")
        return bf16_base_switch(), tree
    return (lambda side, model=None: setattr(module, name, tree if side == "tree" else value)), tree


def bf16_base_switch() -> Callable[..., None]:
    """BF16_BASE is read once, when training binds the model: its "off" side puts each bf16-held base weight's f32
    copy in its place (exact: autocast casts it back to the same bf16 values on every call, as it casts an f32 base)."""
    import torch

    held: dict = {}  # base projection -> (its bf16 weight, that weight in f32)

    def switch(side: str, model=None) -> None:
        if not held and model is not None:
            for m in model.modules():
                w = getattr(m, "weight", None)
                if type(m) is torch.nn.Linear and w is not None and w.dtype == torch.bfloat16:
                    held[m] = (w, torch.nn.Parameter(w.detach().float(), requires_grad=False))
            if not held:
                raise RuntimeError("no base projection is held in bf16: the run did not bind mens.train.bf16_base "
                                   "(it needs a CPU with native bf16, or the cpu preset's autocast)")
        for m, (bf16, f32) in held.items():
            m.weight = bf16 if side == "tree" else f32

    return switch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="A dogfood run's data/train.jsonl.")
    ap.add_argument("--knob", required=True, help="MODULE:NAME=VALUE, the other side's setting.")
    ap.add_argument("--steps", type=int, default=40, help="Training steps; steps 3.. are paired (default 40).")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/step_ab-<host>.json).")
    a = ap.parse_args()
    if not a.data.is_file():
        sys.exit(f"--data {a.data}: no such file; pass a dogfood run's data/train.jsonl")
    if a.steps < 4:
        sys.exit(f"--steps {a.steps}: expected at least 4 (the first two are not paired)")
    try:
        module, name, value = parse_knob(a.knob)
    except ValueError as e:
        sys.exit(str(e))
    from mens.train.allocator import preload_env

    env = preload_env(os.environ)
    if env is not None:  # run on the training commands' allocator, as dogfood's training does
        os.execvpe(sys.executable, [sys.executable, *sys.argv], env)
    try:  # after the re-exec: the knob's module may import torch, which the process replaced above would waste
        switch, tree_value = knob_switch(module, name, value)
    except (ValueError, ImportError) as e:
        sys.exit(str(e))
    import torch

    tree = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "src"], capture_output=True,
                                text=True).stdout.strip())
    run = paired_steps(a.data, a.steps, switch)
    record = {"bench": "step_ab", "machine": machine(), "allocator": os.environ.get("LD_PRELOAD", "system"),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "data": str(a.data),
              "tree": tree + (" (+ uncommitted src)" if dirty else ""),
              "knob": f"{module}:{name}", "tree_value": repr(tree_value), "other_value": repr(value), "run": run,
              "note": "seconds of one step's forward and backward (its micro-batches) with each setting, on the "
                      "same batches inside one run; ratio = other / tree, so above 1 means the tree's is faster"}
    out = a.output or REPO / "bench" / "results" / f"step_ab-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(run["ratio_other_over_tree"]), f"loss sums agree to {run['loss_sum_max_relative_gap']:.1e}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
