"""GPU training throughput: mens side by side with TRL's SFTTrainer (+ peft, + bitsandbytes for QLoRA, + Liger as a
third side when liger-kernel imports), LoRA and QLoRA, on Qwen2.5-0.5B-, Qwen2.5-1.5B- and Qwen3.5-0.8B-shaped models.

Models are built from their real configs with random weights (no download); the data are synthetic prompt/answer
rows of a byte-level tokenizer (one token per character), loss on the answers only. Both sides train on the same
packed rows (mens' packing: examples first-fit into rows of --seq-len, attention kept inside each example through
per-example position ids; TRL gets those rows with their example lengths and packs nothing itself) in the same
order. Every run is a process of its own (--grouped: one per shape, and one per shape for Liger); runs alternate
mens, TRL(, TRL+Liger) and repeat; warm-up steps are not timed; each step end is timed after
`torch.cuda.synchronize()`, peak memory counts from `reset_peak_memory_stats()` at the run's start. Beside each
rate over the timed steps, a rate at the median step's time leaves out what a few steps pay once (a kernel's first
compile for a new shape), which a long run spreads over thousands of steps; the summary gives both and their ratios.

MFU = tokens/s x 6 x N / peak, N = every weight a token is multiplied by (decoder + LM head; the embedding lookup
excluded). The 6N rule counts forward (2N) and backward (4N); a frozen LoRA/QLoRA base skips the weight-gradient
half of the backward, so the hardware does ~4N of it: the figure is the conventional model-FLOPs utilisation, the
same formula on every side, not a count of the FLOPs executed. Attention's own FLOPs are not counted.
With --system-tokens N every example opens with the same N-token system prompt on both sides (the real job's rows:
`mens train` adds its packaged Vox prompt); mens then lays it out once per micro-batch (packing.collate_shared)
where TRL trains every copy, and tokens/s counts the rows' tokens on both sides.
Run: `python bench/gpu_train_speed.py [--device cuda|cpu] [--tiny] [--smoke] [--grouped] [--budget-s S] [--repeats N]`;
writes bench/results/gpu_train_speed-<host>.json (after every run, so a cut-off call still leaves its results).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
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

PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4}
"""Dense bf16 peak by GPU name (NVIDIA data sheets, SXM unless named); --peak-tflops overrides."""
MEASURED_TFLOPS = 795.0
"""What this workplace measured for an 8192^3 bf16 matmul on H100/H200 (~790-800 TFLOP/s); a second MFU uses it."""
# Rough tokens/s on one H100, only to order and budget the runs before any was measured.
RATE_GUESS = {"qwen2.5-0.5b": 40000, "qwen2.5-1.5b": 15000, "qwen3.5-0.8b": 8000}
VERSIONS = ("torch", "transformers", "peft", "trl", "bitsandbytes", "liger-kernel", "accelerate", "datasets",
            "triton", "tokenizers")


def side_availability(device: str) -> dict[str, str | None]:
    """side -> None when it can run, else the reason it is skipped."""
    trl = None if importlib.util.find_spec("trl") else "trl is not installed (pip install -e .[bench])"
    liger = trl or (None if importlib.util.find_spec("liger_kernel") else "liger-kernel is not installed")
    if not liger and device != "cuda":
        liger = "Liger's kernels are Triton GPU kernels; --device cpu"
    return {"mens": None, "mens-chunked": None, "mens-torch": None, "mens-peft": None, "mens-mask": None,
            "mens-flat": None, "trl": trl, "trl-liger": liger}


def plan_runs(shapes, backends, sides, repeats: int) -> list[dict]:
    """Most important first: shapes in the given order, QLoRA before LoRA, each pair's repeats alternating sides."""
    return [{"shape": s, "backend": b, "side": side, "repeat": r}
            for s in shapes for b in backends for r in range(repeats) for side in sides]


def estimate_s(run: dict, a, seen: dict) -> float:
    """Seconds a run will take: the last measured one of its kind, else overhead + tokens / guessed rate (the
    overhead is a process start with its imports, or with --grouped only the model load)."""
    key = (run["shape"], run["backend"], run["side"])
    if key in seen:
        return seen[key]
    tokens = (a.warmup + a.steps) * a.batch_size * a.grad_accum * a.seq_len * 0.9
    grouped = getattr(a, "grouped", False)
    if a.device != "cuda":
        return (3 if grouped else 12) + tokens / 3000
    rate = RATE_GUESS.get(run["shape"], 10000) * (0.7 if run["backend"] == "qlora" else 1.0)
    return (8 if grouped else 25) + tokens / rate


def spread(values: list[float]) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"min": round(min(vals), 3), "median": round(statistics.median(vals), 3), "max": round(max(vals), 3),
            "n": len(vals)}


def mfu(tokens_per_s: float | None, n_params: int, peak_tflops: float | None) -> float | None:
    """6 x N x tokens/s over the peak (see the module docstring for what N is and what the 6 assumes)."""
    if not tokens_per_s or not peak_tflops:
        return None
    return round(6 * n_params * tokens_per_s / (peak_tflops * 1e12), 4)


def summarize(results: list[dict], meta: dict, peak: float | None, measured: float | None) -> dict:
    """Per shape/backend: each side's median rates and memory, mens/peer ratios (min/median/max over the repeat
    pairs), MFU, and the first-batch losses that show both sides score the same tokens the same way."""
    out: dict = {}
    for key in dict.fromkeys((r["shape"], r["backend"]) for r in results):
        group = [r for r in results if (r["shape"], r["backend"]) == key and r.get("ok")]
        by_side = {s: [r for r in group if r["side"] == s] for s in dict.fromkeys(r["side"] for r in group)}
        n = meta.get(key[0], {}).get("matmul_params", 0)
        entry: dict = {"sides": {}}
        for side, rs in by_side.items():
            tps = [r["tokens_per_s"] for r in rs]
            mem = [r.get("peak_allocated_mb") or r["peak_rss_mb"] for r in rs]
            med = statistics.median([t for t in tps if t] or [0]) or None
            entry["sides"][side] = {"supervised_tokens_per_s": spread([r["supervised_tokens_per_s"] for r in rs]),
                                    "median_step_supervised_tokens_per_s": spread(
                                        [r.get("median_step_supervised_tokens_per_s") for r in rs]),
                                    "tokens_per_s": spread(tps), "peak_memory_mb": spread(mem),
                                    "mfu_vs_peak": mfu(med, n, peak), "mfu_vs_measured": mfu(med, n, measured),
                                    "first_batch_loss": rs[0]["first_batch_loss"] if rs else None}
            # what each mens side ran (a kernel that did not bind changes what the ratios measure)
            for what in ("attention", "fused_lora_mlp", "layer_kernels"):
                if seen := sorted({r[what] for r in rs if r.get(what)}):
                    entry["sides"][side][what] = seen[0] if len(seen) == 1 else seen
        mens = by_side.get("mens", [])
        for peer, prs in by_side.items():
            if peer == "mens" or not mens:
                continue
            pairs = list(zip(mens, prs, strict=False))
            entry[f"mens_over_{peer}"] = {
                "supervised_tokens_per_s": spread([m["supervised_tokens_per_s"] / p["supervised_tokens_per_s"]
                                                   for m, p in pairs if p["supervised_tokens_per_s"]]),
                "median_step_supervised_tokens_per_s": spread([
                    m["median_step_supervised_tokens_per_s"] / p["median_step_supervised_tokens_per_s"]
                    for m, p in pairs if m.get("median_step_supervised_tokens_per_s")
                    and p.get("median_step_supervised_tokens_per_s")]),
                "peak_memory": spread([(m.get("peak_allocated_mb") or m["peak_rss_mb"])
                                       / (p.get("peak_allocated_mb") or p["peak_rss_mb"]) for m, p in pairs]),
                "first_batch_loss_abs_diff": round(abs(mens[0]["first_batch_loss"] - prs[0]["first_batch_loss"]), 5),
                "same_timed_tokens": all(m["timed_supervised_tokens"] == p["timed_supervised_tokens"]
                                         for m, p in pairs)}
        out[f"{key[0]}/{key[1]}"] = entry
    return out


def _subprocess(cmd: list[str], timeout_s: float, env: dict) -> tuple[bool, str]:
    """Run a worker; (ok, the tail of its stderr when it failed or ran out of time)."""
    try:
        p = subprocess.run(cmd, env=env, timeout=max(5.0, timeout_s), stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired as e:
        return False, f"timed out after {timeout_s:.0f} s (budget); stderr tail: {(e.stderr or '')[-1500:]}"
    if p.returncode:
        sys.stderr.write(p.stderr[-4000:])
        return False, f"exit {p.returncode}: {p.stderr.strip()[-1500:]}"
    return True, ""


def versions() -> dict:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the same architectures (seconds on CPU)")
    ap.add_argument("--smoke", action="store_true", help="2 steps of every run, no warm-up, one repeat")
    ap.add_argument("--shapes", default=",".join(runs.SHAPES), help="comma-separated, in priority order")
    ap.add_argument("--backends", default="qlora,lora")
    ap.add_argument("--sides", default="mens,trl,trl-liger",
                    help="comma-separated: mens, mens-chunked (mens with its own loss chunks instead of Liger's fused "
                         "linear cross-entropy where that is installed: the loss kernel A/B), mens-torch (mens with "
                         "torch's RMSNorm and MLP instead of Liger's: the layer kernel A/B), mens-peft (peft's LoRA "
                         "MLP modules instead of mens' fused one: that A/B), mens-mask (transformers' block-mask "
                         "attention over packed rows instead of mens' per-example attention), mens-flat (mens with "
                         "every 4-bit projection's absmax dequantized once: mens.train.flat_4bit.FLAT_ABSMAX), trl, "
                         "trl-liger")
    ap.add_argument("--repeats", type=int, help="runs of each side per shape/backend (default 3 on cuda, 1 on cpu)")
    ap.add_argument("--steps", type=int, help="timed optimizer steps per run (default 6; 2 with --tiny)")
    ap.add_argument("--warmup", type=int, help="untimed optimizer steps first (default 2; 1 with --tiny)")
    ap.add_argument("--seq-len", type=int, help="tokens per packed row (default 2048; 128 with --tiny)")
    ap.add_argument("--lora-dropout", type=float, default=runs.SHARED["lora_dropout"],
                    help="LoRA dropout on every side (mens' GPU presets use 0)")
    ap.add_argument("--batch-size", type=int, default=2, help="rows per micro-batch")
    ap.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 4; 1 with --tiny)")
    ap.add_argument("--no-pack", dest="pack", action="store_false", help="one example per row on both sides")
    ap.add_argument("--system-tokens", type=int, default=0, metavar="N",
                    help="a system prompt of N synthetic tokens in every example, on both sides (mens' packaged "
                         "Vox prompt is 272 BPE tokens); 0: none")
    ap.add_argument("--grouped", action="store_true",
                    help="one process per shape (and one per shape for Liger) instead of one per run: imports are "
                         "paid once; each run still counts only its own peak allocation")
    ap.add_argument("--warm-run", action=argparse.BooleanOptionalAction, default=None,
                    help="with --grouped: each group process first runs each side's first run once, untimed (its "
                         "record goes to warm_runs): a side's first run in a process can train slower than its "
                         "repeats after the same warm-up steps (docs/benchmarks.md). Default: on with --device cuda")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="torch.profiler over this many steps after the warm-up, per run: each record gets the ops "
                         "that take the step's time (rates from profiled runs are not comparable)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (--device cpu)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip runs that would end after this")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak for MFU (default: by GPU name)")
    ap.add_argument("--measured-tflops", type=float, default=MEASURED_TFLOPS, help="a measured matmul peak")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimate, run nothing")
    ap.add_argument("--workdir", type=Path, help="keep model directories here (default: a temporary one)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # internal: one run, settings in this JSON file
    ap.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # internal: build one model directory
    a = ap.parse_args(argv)
    small = a.tiny
    a.repeats = a.repeats or (1 if a.smoke or a.device == "cpu" else 3)
    a.steps = 2 if a.smoke else a.steps or (2 if small else 6)
    a.warmup = 0 if a.smoke else (a.warmup if a.warmup is not None else (1 if small else 2))
    a.seq_len = a.seq_len or (128 if small else 2048)
    a.grad_accum = a.grad_accum or (1 if small else 4)
    a.warm_run = a.grouped and not a.smoke and (a.device == "cuda" if a.warm_run is None else a.warm_run)
    tag = "-smoke" if a.smoke else "-tiny" if a.tiny else ""
    a.out = a.out or REPO / "bench" / "results" / f"gpu_train_speed{tag}-{socket.gethostname()}.json"
    return a


def _model_dir(shape: str, a, root: Path, env: dict, deadline: float) -> dict:
    """A shape's model directory, built in a subprocess (it holds the GPU only while it builds)."""
    model_dir = root / shape
    if not (model_dir / "bench_meta.json").is_file():
        job = root / f"{shape}.prepare.json"
        job.write_text(json.dumps({"shape": shape, "tiny": a.tiny, "device": a.device, "out": str(model_dir)}))
        ok, err = _subprocess([sys.executable, __file__, "--prepare", str(job)], deadline - time.time(), env)
        if not ok:
            return {"error": err}
    return json.loads((model_dir / "bench_meta.json").read_text())


def _model(shape: str, a, root: Path, env: dict, deadline: float, doc: dict) -> dict:
    """The shape's model record in `doc` (built on first use; the GPU's description taken from the first)."""
    if shape not in doc["models"]:
        doc["models"][shape] = _model_dir(shape, a, root, env, deadline)
        doc["gpu"] = doc["gpu"] or doc["models"][shape].pop("gpu", None)
    return doc["models"][shape]


def _job(i: int, run: dict, a, root: Path) -> dict:
    """Everything one run needs, written where the worker reads it; the shape's data file is written once."""
    data = root / f"{run['shape']}.train.jsonl"
    if not data.is_file():
        rows = (a.warmup + a.steps) * a.batch_size * a.grad_accum
        runs.write_data(data, n_examples=rows * 6 + 8, seq_len=a.seq_len, seed=runs.SHARED["seed"])
    return {**run, "device": a.device, "tiny": a.tiny, "model_dir": str(root / run["shape"]), "data": str(data),
            "steps": a.steps, "warmup": a.warmup, "seq_len": a.seq_len, "batch_size": a.batch_size,
            "grad_accum": a.grad_accum, "pack": a.pack and run["shape"] not in runs.UNPACKED, "threads": a.threads,
            "profile": a.profile, "lora_dropout": a.lora_dropout, "system_prompt": runs.system_prompt(a.system_tokens),
            "result": str(root / f"run{i}.result.json")}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.prepare:
        job = json.loads(a.prepare.read_text())
        meta = runs.prepare(job["shape"], job["tiny"], job["device"], Path(job["out"]))
        print(json.dumps({"prepared": job["shape"], "matmul_params": meta["matmul_params"]}), flush=True)
        return 0
    if a.worker:
        job = json.loads(a.worker.read_text())
        if isinstance(job, list):
            runs.run_jobs(job)
        elif "jobs" in job:
            runs.run_jobs(job["jobs"], job.get("deadline"))
        else:
            Path(job["result"]).write_text(json.dumps(runs.worker(job)))
        return 0
    return orchestrate(a)


def orchestrate(a) -> int:
    t_start = time.time()
    deadline = t_start + a.budget_s
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    if bad := [s for s in shapes if s not in runs.SHAPES]:
        raise SystemExit(f"--shapes: unknown {', '.join(bad)}; choose from {', '.join(runs.SHAPES)}")
    avail = side_availability(a.device)
    wanted = [s.strip() for s in a.sides.split(",") if s.strip()]
    skipped_sides = {s: avail.get(s, "unknown side") for s in wanted if avail.get(s, "unknown side")}
    sides = [s for s in wanted if s not in skipped_sides]
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    plan = plan_runs(shapes, backends, sides, a.repeats)
    est = sum(estimate_s(r, a, {}) for r in plan) + (0 if a.tiny or a.device != "cuda" else 25 * len(shapes))
    if a.warm_run:  # one untimed run of each side per group process
        est += sum(estimate_s(r, a, {}) for r in plan_runs(shapes, backends[:1], sides, 1))
    print(f"plan: {len(plan)} runs ({', '.join(shapes)} x {', '.join(backends)} x {', '.join(sides)} x "
          f"{a.repeats}); estimate {est:.0f} s, budget {a.budget_s:.0f} s"
          + "".join(f"\nskipped side {s}: {why}" for s, why in skipped_sides.items()), flush=True)
    if a.dry_run:
        return 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join(
               [str(REPO / "src"), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])}
    if a.device == "cpu":
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    doc = {"bench": "gpu_train_speed", "commit": commit(), "machine": {**machine(), "versions": versions()},
           "gpu": None,
           "settings": {k: getattr(a, k) for k in ("device", "tiny", "smoke", "repeats", "steps", "warmup", "seq_len",
                                                   "batch_size", "grad_accum", "pack", "budget_s", "grouped",
                                                   "profile", "system_tokens", "warm_run")},
           "shared_settings": {**runs.SHARED, "lora_dropout": a.lora_dropout},
           "packing": {s: ("both sides unpacked: one example per row" + (f" ({runs.UNPACKED[s]})"
                                                                          if s in runs.UNPACKED and a.pack else "")
                           if not a.pack or s in runs.UNPACKED else
                           "both sides packed the same way: mens' first-fit rows, examples kept apart by position ids")
                       for s in shapes},
           "mfu": {"formula": "tokens_per_s * 6 * matmul_params / peak (see the script's docstring)",
                   "peak_tflops": a.peak_tflops, "measured_tflops": a.measured_tflops},
           "plan_estimate_s": round(est), "skipped_sides": skipped_sides, "skipped_runs": [], "models": {},
           "results": [], "warm_runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = a.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        (_run_smoke if a.smoke else _run_grouped if a.grouped else _run_plan)(plan, a, root, env, deadline, doc)
    doc["wall_s"] = round(time.time() - t_start, 1)
    _write(a.out, doc)
    print(json.dumps(doc["summary"], indent=1), f"\nwrote {a.out}", flush=True)
    return 0 if all(r.get("ok") for r in doc["results"]) else 1


def _run_plan(plan: list[dict], a, root: Path, env: dict, deadline: float, doc: dict) -> None:
    seen: dict = {}
    targets: dict[str, dict] = {}  # shape -> what mens adapted (its adapter_config.json), for the peers
    for i, run in enumerate(plan):
        shape = run["shape"]
        need = estimate_s(run, a, seen) + (0 if shape in doc["models"] else 25 * (a.device == "cuda"))
        if time.time() + need > deadline:
            doc["skipped_runs"].append({**run, "reason": f"budget: needs ~{need:.0f} s, "
                                                         f"{max(0, deadline - time.time()):.0f} s left"})
            continue
        if "error" in _model(shape, a, root, env, deadline, doc):
            doc["results"].append({**run, "ok": False, "error": f"model build failed: {doc['models'][shape]['error']}"})
            continue
        job = {**_job(i, run, a, root), "targets": targets.get(shape)}
        (root / f"run{i}.json").write_text(json.dumps(job))
        t0 = time.time()
        print(f"[{i + 1}/{len(plan)}] {shape} {run['backend']} {run['side']} #{run['repeat'] + 1}", flush=True)
        ok, err = _subprocess([sys.executable, __file__, "--worker", str(root / f"run{i}.json")],
                              deadline - time.time(), env)
        rec = {**run, "ok": ok, "wall_s": round(time.time() - t0, 1)}
        if ok:
            rec.update(json.loads(Path(job["result"]).read_text()))
            if run["side"] == "mens" and rec.get("peft_targets"):
                targets.setdefault(shape, rec["peft_targets"])
            seen[(shape, run["backend"], run["side"])] = rec["wall_s"]
        else:
            rec["error"] = err
        doc["results"].append(rec)
        print(json.dumps({k: rec.get(k) for k in ("ok", "supervised_tokens_per_s", "tokens_per_s",
                                                  "peak_allocated_mb", "peak_rss_mb", "first_batch_loss",
                                                  "wall_s", "error")}), flush=True)
        _write(a.out, doc)


def _run_grouped(plan: list[dict], a, root: Path, env: dict, deadline: float, doc: dict) -> None:
    """The timed runs, one process per shape for mens and TRL (alternating, in plan order), then one per shape for
    TRL + Liger (it patches model classes process-wide, so it never shares a process with the others): imports are
    paid once per process. Each run resets the peak counters and takes off what was still allocated when it started
    (gpu_train_runs.memory); a run that would end past the budget is skipped inside the process."""
    jobs = [{**_job(i, run, a, root), "est_s": estimate_s(run, a, {})} for i, run in enumerate(plan)]
    shapes = list(dict.fromkeys(j["shape"] for j in jobs))
    groups = ([[j for j in jobs if j["shape"] == s and j["side"] != "trl-liger"] for s in shapes]
              + [[j for j in jobs if j["shape"] == s and j["side"] == "trl-liger"] for s in shapes])
    if a.warm_run:
        groups = [_warm_runs(group, root) + group for group in groups]
    targets: dict[str, dict] = {}  # shape -> what mens adapted, for the Liger group's TRL runs
    keys = ("shape", "backend", "side", "repeat")
    for group in filter(None, groups):
        shape = group[0]["shape"]
        if time.time() + group[0]["est_s"] > deadline:
            doc["skipped_runs"] += [{**{k: j[k] for k in keys}, "reason": "budget"} for j in group]
            continue
        if "error" in _model(shape, a, root, env, deadline, doc):
            doc["results"] += [{**{k: j[k] for k in keys}, "ok": False,
                                "error": f"model build failed: {doc['models'][shape]['error']}"} for j in group]
            continue
        for j in group:
            j["targets"] = targets.get(shape)
        batch = root / f"group-{shape}-{group[0]['side']}.json"
        batch.write_text(json.dumps({"jobs": group, "deadline": deadline}))
        print(f"group {shape} {'trl-liger' if group[0]['side'] == 'trl-liger' else 'mens+trl'}: {len(group)} runs",
              flush=True)
        ok, err = _subprocess([sys.executable, __file__, "--worker", str(batch)], deadline - time.time() + 30, env)
        for j in group:
            res = Path(j["result"])
            rec = json.loads(res.read_text()) if res.is_file() else {
                "error": err or "no result written: the group's process ended before this run"}
            if j.get("warm"):
                doc["warm_runs"].append({**{k: j[k] for k in keys}, **{k: rec.get(k) for k in (
                    "skipped", "supervised_tokens_per_s", "peak_allocated_mb", "wall_s", "error")}})
                continue
            if "skipped" in rec:
                doc["skipped_runs"].append({**{k: j[k] for k in keys}, "reason": rec["skipped"]})
                continue
            doc["results"].append({**{k: j[k] for k in keys}, "ok": "error" not in rec, **rec})
            if j["side"] == "mens" and rec.get("peft_targets"):
                targets.setdefault(shape, rec["peft_targets"])
        _write(a.out, doc)


def _warm_runs(group: list[dict], root: Path) -> list[dict]:
    """An untimed copy of each side's first run in this group, to run first in its process."""
    first = {}
    for j in group:
        first.setdefault(j["side"], j)
    return [{**j, "warm": True, "result": str(root / f"warm-{j['shape']}-{j['side']}.result.json")}
            for j in first.values()]


def _run_smoke(plan: list[dict], a, root: Path, env: dict, deadline: float, doc: dict) -> None:
    """Every run for a few steps, grouped into two processes (Liger patches model classes process-wide, so its
    runs get their own): a broken path costs seconds. Timings and peaks from here mean nothing."""
    jobs = [_job(i, run, a, root) for i, run in enumerate(plan)]
    for group in ([j for j in jobs if j["side"] != "trl-liger"], [j for j in jobs if j["side"] == "trl-liger"]):
        if not group:
            continue
        batch = root / f"smoke-{group[0]['side']}.json"
        batch.write_text(json.dumps(group))
        t0 = time.time()
        ok, err = _subprocess([sys.executable, __file__, "--worker", str(batch)], deadline - time.time(), env)
        for job in group:
            res = Path(job["result"])
            rec = json.loads(res.read_text()) if res.is_file() else {"error": err or "no result written"}
            doc["results"].append({**{k: job[k] for k in ("shape", "backend", "side", "repeat")},
                                   "ok": "error" not in rec, **rec})
            print(json.dumps({k: doc["results"][-1].get(k) for k in ("shape", "backend", "side", "ok",
                                                                     "first_batch_loss", "error")}), flush=True)
        print(f"smoke group {group[0]['side']}: {time.time() - t0:.0f} s", flush=True)
    for shape in dict.fromkeys(j["shape"] for j in jobs):
        meta = root / shape / "bench_meta.json"
        doc["models"][shape] = json.loads(meta.read_text()) if meta.is_file() else {"error": "not built"}
        doc["gpu"] = doc["gpu"] or doc["models"][shape].pop("gpu", None)


def _write(out: Path, doc: dict) -> None:
    name = doc["gpu"]["name"] if doc.get("gpu") else ""
    peak = doc["mfu"]["peak_tflops"] or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    doc["mfu"]["peak_tflops_used"] = peak
    doc["summary"] = summarize(doc["results"], doc["models"], peak, doc["mfu"]["measured_tflops"] if name else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
