"""Training throughput on the embedded SmolLM2-135M: the mens loop side by side with TRL (SFTTrainer + peft LoRA,
and + bitsandbytes NF4 for QLoRA).

Data: every shared-corpus Vox example as a prompt/response pair, encoded once by mens' text policy (chat template,
Vox system prompt, loss on the assistant's tokens only, left truncation), so both sides train on the same token
sequences. Both: LoRA on the same projections, f32 on CPU, packing, the same rows per step, AdamW, cosine without
warmup, seed 42. Pairs: mens vs TRL with LoRA, and with QLoRA (bitsandbytes' CPU NF4 on both sides); mens' LoRA
unpacked runs on request. mens' runs use the allocator its training commands use (mimalloc where installed,
mens/train/allocator.py); -system runs put it on the C library's malloc, and -mimalloc runs put TRL on mimalloc, to
show how much of a ratio is the allocator; -peft runs use peft's LoRA MLP instead of mens' fused one, and -mask runs
attend packed rows through transformers' block mask instead of one example at a time (`ratios_ab`: mens with the
feature over mens without, round against round). Every run is a subprocess of its own (so peak RSS is per run), and
the runs alternate mens, TRL, mens, TRL ... for --repeats rounds, so a drift of the machine hits both sides. Reports
input and supervised tokens/s, setup and train time, peak RSS, first and final loss, and per pair the mens/TRL ratios
with their spread (min/median/max over the rounds) and the criterion: mens >= 1.5x TRL's supervised tokens/s at equal or
lower peak RSS. TRL's entropy and token-accuracy metrics cannot be turned off in trl 1.16 (no SFTConfig option; its
fused LM head computes them); the record says so. The TRL side needs `pip install -e .[bench] -c constraints.txt`.
Run: `python bench/train_speed.py [--steps N] [--repeats R] [--threads T] [--runs a,b] [--out PATH]`; writes
bench/results/train_speed-<host>.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.time()  # a worker's setup time counts from here: torch imports, model load, data encoding

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gpu_train_runs import adapter_targets  # noqa: E402
from machine import machine  # noqa: E402

from mens.train import allocator  # noqa: E402

RUNS = {  # name -> (side, backend, pack); a round runs them in this order (mens and TRL alternate)
    "mens-lora-packed": ("mens", "lora", True),
    "trl-lora-packed": ("trl", "lora", True),
    "mens-qlora-packed": ("mens", "qlora", True),
    "trl-qlora-packed": ("trl", "qlora", True),
    "mens-lora-unpacked": ("mens", "lora", False),
    # mens on the C library's malloc (MENS_ALLOCATOR=system) instead of the mimalloc its training commands preload
    "mens-lora-system": ("mens", "lora", True),
    "mens-qlora-system": ("mens", "qlora", True),
    # host_memory: lean (glibc's mmap threshold fixed: less peak RSS, slower; mens/train/host_memory.py)
    "mens-lora-lean": ("mens", "lora", True),
    "mens-qlora-lean": ("mens", "qlora", True),
    # TRL with mimalloc preloaded the way mens preloads it: how much of mens' lead is the allocator alone
    "trl-lora-mimalloc": ("trl", "lora", True),
    "trl-qlora-mimalloc": ("trl", "qlora", True),
    # peft's LoRA MLP modules instead of mens' fused one (mens/train/lora_mlp.py; it applies without LoRA dropout)
    "mens-lora-peft": ("mens", "lora", True),
    "mens-qlora-peft": ("mens", "qlora", True),
    # transformers' block-mask attention over packed rows instead of mens' per-example attention
    # (mens/train/segment_attention.py)
    "mens-lora-mask": ("mens", "lora", True),
    "mens-qlora-mask": ("mens", "qlora", True),
}
DEFAULT_RUNS = ("mens-lora-packed", "trl-lora-packed", "mens-qlora-packed", "trl-qlora-packed")
PAIRS = (("mens-lora-packed", "trl-lora-packed"), ("mens-qlora-packed", "trl-qlora-packed"),  # ratios: mens / trl
         ("mens-lora-system", "trl-lora-packed"), ("mens-qlora-system", "trl-qlora-packed"),
         ("mens-lora-lean", "trl-lora-packed"), ("mens-qlora-lean", "trl-qlora-packed"),
         ("mens-lora-packed", "trl-lora-mimalloc"), ("mens-qlora-packed", "trl-qlora-mimalloc"),
         ("mens-lora-peft", "trl-lora-packed"), ("mens-qlora-peft", "trl-qlora-packed"),
         ("mens-lora-mask", "trl-lora-packed"), ("mens-qlora-mask", "trl-qlora-packed"))

# mens against mens with one feature switched off (same round against same round): what the feature is worth
AB_PAIRS = (("mens-lora-packed", "mens-lora-mask"), ("mens-qlora-packed", "mens-qlora-mask"),
            ("mens-lora-packed", "mens-lora-peft"), ("mens-qlora-packed", "mens-qlora-peft"))
CRITERION = {"supervised_tokens_per_s_ratio_min": 1.5, "peak_rss_ratio_max": 1.0}
TRL_METRICS = ("entropy and mean_token_accuracy stay on: trl 1.16's SFTTrainer.compute_loss computes them every step "
               "(from its fused LM head) and SFTConfig has no option to turn them off")
# One source for the settings both sides share (mens' TrainConfig names).
SHARED = {"batch_size": 2, "grad_accum": 2, "learning_rate": 2e-4, "weight_decay": 0.01, "max_grad_norm": 1.0,
          "r": 16, "lora_alpha": 32.0, "lora_dropout": 0.05, "seed": 42, "warmup_steps": 0}
# dogfood's one-line system prompt: with the packaged ~270-token one no two examples fit a 512-token row, and
# packing (where much of mens' speed comes from) would not be measured at all.
from mens.dogfood.pipeline import SHORT_SYSTEM_PROMPT as SYSTEM_PROMPT  # noqa: E402  (after the sys.path line)

TRL_MISSING = ("TRL side skipped: `trl` is not installed in this environment. Install the bench extra with\n"
               "  pip install -e .[bench] -c constraints.txt\nand run again; the mens side runs now.")
VERSIONS = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "tokenizers")


def run_env(name: str, env: dict[str, str]) -> dict[str, str]:
    """A run's environment: mens' own runs on the allocator `mens train` re-executes itself with (MENS_ALLOCATOR
    auto: mimalloc where installed and no NVIDIA driver is loaded; mens.train.allocator), -system and -lean runs on
    the C library's malloc, TRL as its users run it, and -mimalloc runs on mimalloc wherever it is installed."""
    base = {k: v for k, v in env.items() if k not in (allocator.CHOICE, allocator.PRELOADED)}
    if name.endswith(("-system", "-lean")):
        return {**base, allocator.CHOICE: "system"}
    if name.endswith("-mimalloc"):
        return allocator.preload_env({**base, allocator.CHOICE: "mimalloc"}) or base
    if RUNS[name][0] == "mens":
        return allocator.preload_env(base) or base
    return base


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


def _finish(result: dict, train_s: float, start_ts: float) -> dict:
    """Add the figures both sides compute the same way: rates, setup time, peak RSS, threads."""
    import torch

    result.update(train_time_s=round(train_s, 2), setup_s=round(start_ts - T_START, 2),
                  tokens_per_s=round(result["input_tokens"] / train_s, 1),
                  supervised_tokens_per_s=round(result["supervised_tokens"] / train_s, 1),
                  peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  torch_threads=torch.get_num_threads())
    return result


def run_mens(data: Path, tmp: Path, backend: str, pack: bool, args, host_memory: str = "fast") -> dict:
    from mens.run_records import MANIFEST, PREFLIGHT
    from mens.train.config import TrainConfig
    from mens.train.run import run_training
    from mens.train.telemetry import read_events

    out = tmp / "run"
    cfg = TrainConfig(data=str(data), output_dir=str(out), model="smollm2-135m", backend=backend, device="cpu",
                      max_steps=args.steps, seq_len=args.seq_len, val_fraction=0, save_every=0, eval_every=0,
                      pack=pack, num_threads=args.threads, min_examples=10, autocast="off", host_memory=host_memory,
                      system_prompt=SYSTEM_PROMPT, **SHARED)
    s = run_training(cfg)
    events = read_events(out)
    losses = [e["loss"] for e in events if e["event"] == "step"]
    start_ts = next(e["ts_ms"] for e in events if e["event"] == "train_start") / 1000  # just before step 1
    examples = json.loads((out / MANIFEST).read_text())["examples"]
    checks = json.loads((out / PREFLIGHT).read_text())["checks"]
    return _finish({"steps": s["steps"], "examples": examples["train"], "packed_rows": examples["train_rows"],
                    "peft_targets": adapter_targets(out),
                    "attention": next((c["detail"] for c in checks if c["check"] == "attention"), "block mask"),
                    "fused_lora_mlp": next((c["detail"] for c in checks if c["check"] == "fused LoRA MLP"), "peft's"),
                    "input_tokens": s["total_tokens"], "supervised_tokens": s["supervised_tokens"],
                    "first_loss": losses[0], "final_loss": losses[-1], "preflight_loss": s["first_loss"]},
                   s["train_time_s"], start_ts)


def run_trl(data: Path, tmp: Path, backend: str, args) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from mens.model.load import load_tokenizer, resolve_model
    from mens.train.data import read_examples
    from mens.train.text import IGNORE

    torch.set_num_threads(args.threads)
    model_dir, _ = resolve_model("smollm2-135m")
    tok = load_tokenizer(model_dir)  # the tokenizer mens trains with (same chat template, same pad token)
    examples, _, _ = read_examples(data, tok, seq_len=args.seq_len, ce_last_k=0,
                                   system_prompt=SYSTEM_PROMPT, min_rating=3)
    # Pre-tokenized: TRL skips its own chat rendering and builds labels from completion_mask (completion_only_loss).
    ds = Dataset.from_dict({"input_ids": [e.ids for e in examples],
                            "completion_mask": [[int(x != IGNORE) for x in e.labels] for e in examples]})
    kwargs = {}
    if backend == "qlora":  # mens' own NF4 settings (double quantization, f32 compute on CPU)
        from mens.model.quant import nf4_config

        kwargs = {"quantization_config": nf4_config("cpu"), "device_map": {"": "cpu"}}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **kwargs)
    model.config.use_cache = False
    # what the mens run of this round adapted (its adapter_config.json), else peft's every linear layer but the head
    targets = json.loads(args.targets) if args.targets else {"target_modules": "all-linear"}
    lora = LoraConfig(r=SHARED["r"], lora_alpha=SHARED["lora_alpha"], lora_dropout=SHARED["lora_dropout"],
                      bias="none", task_type="CAUSAL_LM", **targets)
    conf = SFTConfig(output_dir=str(tmp / "trl"), max_steps=args.steps, max_length=args.seq_len,
                     per_device_train_batch_size=SHARED["batch_size"],
                     gradient_accumulation_steps=SHARED["grad_accum"], learning_rate=SHARED["learning_rate"],
                     lr_scheduler_type="cosine", warmup_steps=SHARED["warmup_steps"],
                     weight_decay=SHARED["weight_decay"], max_grad_norm=SHARED["max_grad_norm"], optim="adamw_torch",
                     seed=SHARED["seed"], data_seed=SHARED["seed"], packing=True, packing_strategy="bfd",
                     padding_free=True, completion_only_loss=True, bf16=False, fp16=False, use_cpu=True,
                     gradient_checkpointing=False,  # TRL's default is True; mens trains without it
                     # optim: mens steps torch.optim.AdamW (foreach); transformers' default would be the fused one
                     logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0 = self.t1 = 0.0
            self.losses: list[float] = []

        def on_train_begin(self, *a, **k):
            self.t0 = time.time()

        def on_step_end(self, *a, **k):
            self.t1 = time.time()

        def on_log(self, *a, logs=None, **k):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    class CountingSFTTrainer(SFTTrainer):
        """Counts tokens as mens does: real input tokens, and label positions the loss scores."""

        input_tokens = supervised_tokens = 0

        def compute_loss(self, model, inputs, *a, **k):
            if model.training:
                mask = inputs.get("attention_mask")
                self.input_tokens += int(inputs["input_ids"].numel() if mask is None else mask.sum())
                self.supervised_tokens += int((inputs["labels"][..., 1:] != IGNORE).sum())
            return super().compute_loss(model, inputs, *a, **k)

    clock = Clock()
    torch.manual_seed(SHARED["seed"])  # adapter init
    trainer = CountingSFTTrainer(model=model, args=conf, train_dataset=ds, processing_class=tok, peft_config=lora,
                                 callbacks=[clock])
    trainer.train()
    leak = _trl_packing_leak(trainer, examples[0].ids[:24], examples[1].ids[:24])  # after the timed steps
    return _finish({"steps": trainer.state.global_step, "examples": len(examples),
                    "packed_rows": len(trainer.train_dataset),
                    "example_tokens": sum(len(e.ids) for e in examples),
                    "packed_tokens": sum(len(x) for x in trainer.train_dataset["input_ids"]),
                    "input_tokens": trainer.input_tokens, "supervised_tokens": trainer.supervised_tokens,
                    "peft_targets": targets,
                    "first_loss": clock.losses[0], "final_loss": clock.losses[-1],
                    "padding_free": trainer.padding_free, "attn_implementation": model.config._attn_implementation,
                    "packing_isolates_examples": leak < 1e-4, "packing_leak_max_abs_logit": leak},
                   clock.t1 - clock.t0, clock.t0)


def _trl_packing_leak(trainer, a: list[int], b: list[int]) -> float:
    """Max |logit difference| on example b between TRL's packed batch [a, b] and b alone (0 = isolated)."""
    import torch

    batch = trainer.data_collator([{"input_ids": a}, {"input_ids": b}])
    batch.pop("labels")
    model = trainer.model
    model.eval()
    with torch.no_grad():
        packed = model(**batch).logits[0, len(a):len(a) + len(b)]
        alone = model(input_ids=torch.tensor([b])).logits[0]
    return float((packed - alone).abs().max())


def worker(args) -> None:
    allocator.settle()  # preloaded by the parent: tools this run starts get the environment back
    side, backend, pack = RUNS[args.worker]
    SHARED["lora_dropout"] = args.lora_dropout  # both sides
    if args.worker.endswith("-peft"):
        from mens.train import lora_mlp

        lora_mlp.FUSED_LORA_MLP = "off"
    if args.worker.endswith("-mask"):
        from mens.train import segment_attention

        segment_attention.SEGMENT_ATTENTION = "off"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lean = "lean" if args.worker.endswith("-lean") else "fast"
        r = (run_mens(args.data, tmp, backend, pack, args, lean) if side == "mens"
             else run_trl(args.data, tmp, backend, args))
    args.result.write_text(json.dumps({"run": args.worker, "side": side, "backend": backend, "pack": pack,
                                       "allocator": allocator.in_use(), **r}))


def machine_info(threads: int) -> dict:
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {**machine(), "threads": threads, "versions": versions}


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"min": round(ordered[0], 3), "median": round(median, 3), "max": round(ordered[-1], 3), "n": len(values)}


def ratios(results: list[dict], pairs=PAIRS) -> dict:
    """Per pair, mens / TRL of round i against round i (> 1 on a rate: mens is faster; < 1 on memory: mens uses
    less), min/median/max over the rounds, and whether the criterion holds on the medians."""
    out = {}
    for m_name, t_name in pairs:
        rounds = list(zip([r for r in results if r["run"] == m_name], [r for r in results if r["run"] == t_name],
                          strict=False))
        if not rounds:
            continue
        keys = ("supervised_tokens_per_s", "tokens_per_s", "peak_rss_mb", "train_time_s", "setup_s")
        entry = {k: _spread([m[k] / t[k] for m, t in rounds if t[k]]) for k in keys}
        sup, rss = entry["supervised_tokens_per_s"], entry["peak_rss_mb"]
        entry["criterion"] = {**CRITERION, "met": bool(sup and rss and sup["median"] >= 1.5 and rss["median"] <= 1.0),
                              "met_in_every_round": bool(sup and rss and sup["min"] >= 1.5 and rss["max"] <= 1.0)}
        out[f"{m_name} / {t_name}"] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads in every run")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lora-dropout", type=float, default=SHARED["lora_dropout"],
                    help="LoRA dropout on both sides (the cpu preset uses 0; mens' fused LoRA MLP needs 0)")
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus" / "vox")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each runs every --runs entry once, in order")
    ap.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"train_speed-{socket.gethostname()}.json")
    ap.add_argument("--worker", choices=RUNS, help=argparse.SUPPRESS)  # internal: one run in this process
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--targets", help=argparse.SUPPRESS)  # internal: the PEFT targets mens chose, as JSON
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in RUNS]:
        ap.error(f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    skipped = {}
    if importlib.util.find_spec("trl") is None and any(RUNS[n][0] == "trl" for n in names):
        print(TRL_MISSING, file=sys.stderr, flush=True)
        skipped = {n: "trl is not installed (pip install -e .[bench] -c constraints.txt)"
                   for n in names if RUNS[n][0] == "trl"}
        names = [n for n in names if n not in skipped]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    results, targets = [], {}  # targets: backend -> what mens adapted, handed to TRL
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        n_rows = make_data(args.corpus, data)
        if not n_rows:
            sys.exit(f"--corpus {args.corpus}: no .vox files there (the shared Vox corpus, ../shared/corpus/vox from "
                     "a checkout beside ../shared, is the default)")
        for rnd, name in ((r, n) for r in range(args.repeats) for n in names):  # mens, trl, mens, trl, ...
            res = Path(tmp) / f"{name}-{rnd}.json"
            t0 = time.time()
            side, backend, _ = RUNS[name]
            extra = ["--targets", json.dumps(targets[backend])] if side == "trl" and backend in targets else []
            subprocess.run([sys.executable, __file__, "--worker", name, "--data", str(data), "--result", str(res),
                            "--steps", str(args.steps), "--threads", str(args.threads), "--seq-len", str(args.seq_len),
                            "--lora-dropout", str(args.lora_dropout), *extra], env=run_env(name, env), check=True)
            results.append({**json.loads(res.read_text()), "round": rnd, "wall_time_s": round(time.time() - t0, 1)})
            if side == "mens" and results[-1].get("peft_targets"):
                targets.setdefault(backend, results[-1]["peft_targets"])
            print(json.dumps(results[-1]), flush=True)
    doc = {"bench": "train_speed", "machine": machine_info(args.threads), "rows": n_rows, "steps": args.steps,
           "repeats": args.repeats, "seq_len": args.seq_len,
           "shared_settings": {**SHARED, "lora_dropout": args.lora_dropout}, "trl_metrics": TRL_METRICS,
           "batch": f"{SHARED['batch_size']} rows x accum {SHARED['grad_accum']} per optimizer step (a row: examples "
                    "packed up to seq_len, or one example unpacked)",
           "ratios_mens_over_trl": ratios(results),
           "ratios_ab": {pair: {k: v for k, v in r.items() if k != "criterion"}
                         for pair, r in ratios(results, AB_PAIRS).items()},
           "skipped": skipped, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"ratios mens/trl: {json.dumps(doc['ratios_mens_over_trl'])}\nwrote {args.out}")


if __name__ == "__main__":
    main()
