"""One timed training run of bench/gpu_train_speed.py, in a process of its own: the model shapes, the synthetic data,
and the two sides (mens through `run_training`, TRL's `SFTTrainer` + peft [+ bitsandbytes] [+ Liger]).

Both sides read the same train.jsonl, encode it with mens' text policy (ChatML, loss on the answer only), pack it
with mens' packing into the same rows and take the rows in mens' batch order, so every optimizer step sees the same
tokens on both sides. Run: imported by bench/gpu_train_speed.py (`--worker` / `--prepare`), never by users.
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import time
from pathlib import Path

# Real shapes (config.json of each model on the hub); weights are random: speed and memory do not depend on them.
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    # Qwen3.5-0.8B's text model: 3 Gated-DeltaNet (linear attention) layers, then one full-attention layer, x6.
    "qwen3.5-0.8b": {"model_type": "qwen3_5_text", "hidden_size": 1024, "intermediate_size": 3584,
                     "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                     "vocab_size": 248320, "tie_word_embeddings": True, "max_position_embeddings": 262144,
                     "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
                     "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                     "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}},
}
# --tiny: the same architectures (and Qwen3.5's layer mix) shrunk so a CPU run takes seconds.
TINY: dict[str, dict] = {
    "qwen2.5-0.5b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "vocab_size": 1024},
    "qwen2.5-1.5b": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "vocab_size": 1024},
    "qwen3.5-0.8b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "head_dim": 16, "vocab_size": 1024, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
                     "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                     "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
}
UNPACKED: dict[str, str] = {
    "qwen3.5-0.8b": "TRL cannot pack it here: transformers keeps packed sequences apart in Qwen3.5's linear-attention "
                    "convolution only with the causal_conv1d package (not installed), so both sides run unpacked",
}
"""Shapes that both sides train unpacked (one example per row, padded batches), and why."""
SPECIALS = ["<|im_start|>", "<|im_end|>", "<unk>", "system", "user", "assistant"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# One source for the settings both sides share (mens' TrainConfig names); the seed also fixes the data.
SHARED = {"learning_rate": 2e-4, "weight_decay": 0.01, "max_grad_norm": 1.0, "r": 16, "lora_alpha": 32.0,
          "lora_dropout": 0.05, "seed": 42, "warmup_steps": 0}


def model_config(shape: str, tiny: bool):
    """The transformers config of a shape (Qwen2Config or Qwen3_5TextConfig), shrunk with --tiny."""
    from transformers import AutoConfig

    values = {**SHAPES[shape], **(TINY[shape] if tiny else {})}
    return AutoConfig.for_model(**values)


def build_tokenizer():
    """A byte-level BPE with no merges (every character one token) plus the ChatML markers.

    Byte-level because transformers 5 does not load a saved tokenizer as written: it rebuilds it as the model
    type's own class (Qwen2Tokenizer for qwen2 and qwen3_5_text), keeping the vocabulary and merges and putting its
    own pre-tokenizer in front. A word-level vocabulary does not survive that (every word became nothing); single
    bytes do. `prepare` checks the round trip through mens' own loader."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS[:3])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                 unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    hf.chat_template = CHATML
    return hf


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def synthetic_text(rng: random.Random, n_tokens: int) -> str:
    """`n_tokens` characters (so `n_tokens` tokens of build_tokenizer): 4-letter words between single spaces."""
    return "".join(" " if i % 5 == 4 else rng.choice(LETTERS) for i in range(max(1, n_tokens))).strip() or "a"


def system_prompt(n_tokens: int) -> str:
    """A fixed system prompt of `n_tokens` synthetic tokens ("" for none), the same on every side and run."""
    return synthetic_text(random.Random(1), n_tokens) if n_tokens > 0 else ""


def write_data(path: Path, *, n_examples: int, seq_len: int, seed: int) -> None:
    """prompt/response rows of random text; lengths spread so that packing matters (answers ~1/64-3/8 of a row)."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return synthetic_text(rng, rng.randint(max(1, lo), max(1, hi)))

    with path.open("w", encoding="utf-8") as f:
        for _ in range(n_examples):
            row = {"prompt": text(seq_len // 128, seq_len // 16), "response": text(seq_len // 64, seq_len * 3 // 8)}
            f.write(json.dumps(row) + "\n")


def check_tokenizer(model_dir: Path) -> None:
    """The tokenizer mens loads from `model_dir` encodes synthetic text one token per character: otherwise the
    runs would train on whatever it made of the text (a wrong benchmark that still runs)."""
    from mens.model.load import load_tokenizer

    tok = load_tokenizer(model_dir)
    sample = synthetic_text(random.Random(0), 40)
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    if len(ids) != len(sample) or tok.unk_token_id in ids:
        raise RuntimeError(f"{model_dir}: {type(tok).__name__} encodes {len(sample)} characters of synthetic text as "
                           f"{len(ids)} tokens ({tok.convert_ids_to_tokens(ids[:8])}...); the bench tokenizer did "
                           "not survive loading")


def save_random_model(cfg, device: str, out: Path):
    """A randomly initialised model of `cfg` (bf16 on CUDA, f32 on CPU, seed 0) saved to `out` with the bench
    tokenizer, whose round trip is checked; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    check_tokenizer(out)
    return model


def prepare(shape: str, tiny: bool, device: str, out: Path) -> dict:
    """Save a randomly initialised model of `shape` (bf16 on CUDA, f32 on CPU) and the tokenizer to `out`."""
    from machine import gpu

    cfg = model_config(shape, tiny)
    model = save_random_model(cfg, device, out)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    layers = {t: types.count(t) for t in dict.fromkeys(types)}
    meta = {"shape": shape, "tiny": tiny, "matmul_params": matmul_params(model),
            "total_params": sum(p.numel() for p in model.parameters()), "layer_types": layers,
            "config": {k: v for k, v in cfg.to_dict().items() if k in SHAPES[shape] or k == "model_type"},
            "gpu": gpu() if device == "cuda" else None}
    (out / "bench_meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def matmul_params(model) -> int:
    """N of the 6N rule: every weight a token is multiplied by (decoder projections and the LM head, counted once
    when tied to the embedding); the embedding lookup itself does no matmul."""
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters() if p is not emb)  # an untied LM head is in here
    head = model.get_output_embeddings()
    return n + (emb.numel() if head is not None and head.weight is emb else 0)  # a tied head multiplies by emb


class StepClock:
    """Wall time at the end of every optimizer step, after `torch.cuda.synchronize()` on CUDA; with `profile`, a
    torch.profiler record of `profile` steps after the warm-up ones (its overhead makes those runs' rates
    incomparable: the record is for finding where a step's time goes)."""

    def __init__(self, device: str, profile: int = 0, warmup: int = 0):
        self.device, self.t_start, self.steps = device, None, []
        self.prof = None
        if profile:
            import torch
            from torch.profiler import ProfilerActivity, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
            # step() is called at each optimizer step's end: skip the warm-up steps, one profiler warm-up, record
            self.prof = torch.profiler.profile(activities=acts, schedule=schedule(
                wait=max(0, warmup - 1), warmup=1, active=profile, repeat=1))

    def _now(self) -> float:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        if self.prof is not None:
            self.prof.start()
        self.t_start = self._now()

    def step(self, tokens: int, supervised: int, loss: float | None) -> None:
        self.steps.append({"t": self._now(), "tokens": tokens, "supervised": supervised, "loss": loss})
        if self.prof is not None:
            self.prof.step()

    def profile_table(self, top: int = 30) -> dict | None:
        """The recorded steps' ops by self time on the device (CUDA) or the CPU, the largest first."""
        if self.prof is None:
            return None
        self.prof.stop()
        cuda = self.device == "cuda"

        def self_us(e) -> float:  # torch renamed the CUDA fields to "device" fields
            if not cuda:
                return e.self_cpu_time_total
            return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)

        events = sorted(self.prof.key_averages(), key=self_us, reverse=True)
        total = sum(self_us(e) for e in events) or 1.0
        return {"clock": "device (CUDA kernels)" if cuda else "cpu", "total_ms": round(total / 1e3, 2),
                "ops": [{"name": e.key[:120], "calls": e.count, "self_ms": round(self_us(e) / 1e3, 3),
                         "share": round(self_us(e) / total, 4),
                         "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3)} for e in events[:top]]}

    def timed(self, warmup: int) -> dict:
        """Rates over the steps after `warmup` (their tokens over the time from the end of the last warm-up step),
        and the supervised rate at the median timed step's time (`median_step_supervised_tokens_per_s`): a few
        timed steps weigh a one-time cost, such as a kernel's first compile for a new shape, more than a long
        run's thousands of steps do; the median leaves it out. Both are recorded; neither replaces the other."""
        t0 = self.steps[warmup - 1]["t"] if warmup else self.t_start
        timed = self.steps[warmup:]
        secs = timed[-1]["t"] - t0 if timed else 0.0
        tok, sup = sum(s["tokens"] for s in timed), sum(s["supervised"] for s in timed)
        step_s = [b["t"] - a for a, b in zip([self.t_start] + [s["t"] for s in self.steps], self.steps, strict=False)]
        median_s = statistics.median(step_s[warmup:]) if timed else 0.0
        return {"timed_steps": len(timed), "timed_s": round(secs, 3), "timed_input_tokens": tok,
                "timed_supervised_tokens": sup, "tokens_per_s": round(tok / secs, 1) if secs else None,
                "supervised_tokens_per_s": round(sup / secs, 1) if secs else None,
                "median_step_supervised_tokens_per_s": round(sup / (median_s * len(timed)), 1) if median_s else None,
                "step_losses": [s["loss"] for s in self.steps], "step_s": [round(t, 4) for t in step_s],
                **({"profile": self.profile_table()} if self.prof is not None else {})}


def memory(device: str, baseline: int = 0) -> dict:
    """Peak RSS of the process, and on CUDA the run's peak allocation: `baseline` (bytes still allocated when the
    run started, non-zero only when runs share a process) is taken off, so each run counts only its own tensors."""
    out = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device == "cuda":
        import torch

        out.update(peak_allocated_mb=round((torch.cuda.max_memory_allocated() - baseline) / 2**20, 1),
                   peak_reserved_mb=round(torch.cuda.max_memory_reserved() / 2**20, 1),
                   baseline_allocated_mb=round(baseline / 2**20, 1))
    return out


def run_mens(a: dict, work: Path) -> dict:
    """mens through its public entry point (`run_training`), timed by a hook on its step telemetry."""
    from mens.run_records import MANIFEST, PREFLIGHT
    from mens.train import telemetry
    from mens.train.config import TrainConfig
    from mens.train.run import run_training

    clock, emit = StepClock(a["device"], a.get("profile", 0), a["warmup"]), telemetry.Telemetry.emit

    def timed_emit(self, event, **fields):  # the step event comes after optimizer.step(): the whole step is in it
        if event == "train_start":
            clock.start()
        elif event == "step":
            clock.step(fields["tokens"], fields["supervised_tokens"], fields["loss"])
        return emit(self, event, **fields)

    from mens.train import loss

    telemetry.Telemetry.emit = timed_emit  # undone below: grouped runs share this process
    from mens.train import flat_4bit, kernels, lora_mlp, segment_attention

    fused, layer, mlp = loss.FUSED_CE, kernels.LAYER_KERNELS, lora_mlp.FUSED_LORA_MLP
    segments = segment_attention.SEGMENT_ATTENTION
    loss.FUSED_CE = "off" if a["side"] == "mens-chunked" else "auto"  # the loss kernel A/B (mens.train.loss)
    kernels.LAYER_KERNELS = "off" if a["side"] == "mens-torch" else "auto"  # the layer kernel A/B
    lora_mlp.FUSED_LORA_MLP = "off" if a["side"] == "mens-peft" else "auto"  # the fused LoRA MLP A/B
    flat = flat_4bit.FLAT_ABSMAX
    flat_4bit.FLAT_ABSMAX = "auto" if a["side"] == "mens-flat" else "off"  # 4-bit absmax dequantized once
    # per-example (varlen flash) attention against transformers' block mask
    segment_attention.SEGMENT_ATTENTION = "off" if a["side"] == "mens-mask" else "auto"
    cfg = TrainConfig(data=a["data"], output_dir=str(work / "run"), model=a["model_dir"], backend=a["backend"],
                      device=a["device"], max_steps=a["warmup"] + a["steps"], seq_len=a["seq_len"],
                      batch_size=a["batch_size"], grad_accum=a["grad_accum"], val_fraction=0, save_every=0,
                      eval_every=0, pack=a["pack"], min_examples=1, system_prompt=a.get("system_prompt", ""),
                      num_threads=a["threads"],
                      log_every_s=3600, micro_batch="fixed",  # the passes TRL makes
                      **{**SHARED, "lora_dropout": a.get("lora_dropout", SHARED["lora_dropout"])})
    try:
        summary = run_training(cfg)
    finally:
        telemetry.Telemetry.emit, loss.FUSED_CE = emit, fused
        kernels.LAYER_KERNELS, lora_mlp.FUSED_LORA_MLP, flat_4bit.FLAT_ABSMAX = layer, mlp, flat
        segment_attention.SEGMENT_ATTENTION = segments
    manifest = json.loads((work / "run" / MANIFEST).read_text())
    checks = json.loads((work / "run" / PREFLIGHT).read_text())["checks"]
    return {"first_batch_loss": summary["first_loss"], "peft_targets": adapter_targets(work / "run"),
            "layer_kernels": next((c["detail"] for c in checks if c["check"] == "layer kernels"), "torch's"),
            "fused_lora_mlp": next((c["detail"] for c in checks if c["check"] == "fused LoRA MLP"), "peft's"),
            "attention": next((c["detail"] for c in checks if c["check"] == "attention"), "block mask"),
            "flat_absmax": next((c["detail"] for c in checks if c["check"] == "4-bit absmax"), False),
            "matmul_dtype": manifest.get("matmul_dtype"), "packed_rows": manifest["examples"]["train_rows"],
            **clock.timed(a["warmup"])}


def adapter_targets(run_dir: Path) -> dict | None:
    """What mens adapted, as its saved PEFT adapter_config.json says: the TRL side adapts exactly the same."""
    path = run_dir / "adapter_config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    return {k: cfg[k] for k in ("target_modules", "target_parameters", "layers_to_transform", "layers_pattern")
            if cfg.get(k)}


def _flat(row) -> dict:
    """A row as TRL's collator reads it: ids, labels and (packed: padding-free) the length of each example."""
    out = {"input_ids": [t for ex in row for t in ex.ids], "labels": [t for ex in row for t in ex.labels]}
    return {**out, "seq_lengths": [len(ex.ids) for ex in row]} if len(row) > 1 else out


def _trl_rows(a: dict, tok):
    """mens' encoding, packing and batch order, so TRL's step s sees mens' step s rows."""
    from mens.train.data import build_rows, plan_steps, read_examples

    examples, _, _ = read_examples(Path(a["data"]), tok, seq_len=a["seq_len"], ce_last_k=0,
                                   system_prompt=a.get("system_prompt") or None, min_rating=3)
    rows = build_rows(examples, pack=a["pack"], seq_len=a["seq_len"])
    total = a["warmup"] + a["steps"]
    plan = plan_steps(len(rows), a["batch_size"] * a["grad_accum"], epochs=1, max_steps=total, seed=SHARED["seed"])
    return rows, [plan.rows_for_step(s) for s in range(total)]


def _trl_model(a: dict):
    import torch
    from transformers import AutoModelForCausalLM

    from mens.model.quant import compute_dtype, nf4_config

    kwargs: dict = {"dtype": compute_dtype(a["device"])}  # bf16 on a bf16 GPU, f32 on CPU: as mens loads it
    if a["backend"] == "qlora":
        kwargs.update(quantization_config=nf4_config(a["device"]), device_map={"": a["device"]})
    model = AutoModelForCausalLM.from_pretrained(a["model_dir"], **kwargs)
    if a["backend"] != "qlora":
        model.to(a["device"])
    model.config.use_cache = False
    torch.manual_seed(SHARED["seed"])  # adapter init
    return model


def trl_config(a: dict, out: Path, liger: bool):
    """SFTConfig matching mens' settings: same batch, optimizer, schedule, no gradient checkpointing."""
    import torch
    from trl import SFTConfig

    bf16 = a["device"] == "cuda" and torch.cuda.is_bf16_supported()
    return SFTConfig(output_dir=str(out), max_steps=a["warmup"] + a["steps"],
                     per_device_train_batch_size=a["batch_size"], gradient_accumulation_steps=a["grad_accum"],
                     learning_rate=SHARED["learning_rate"],
                     lr_scheduler_type="cosine", warmup_steps=SHARED["warmup_steps"],
                     weight_decay=SHARED["weight_decay"], max_grad_norm=SHARED["max_grad_norm"], optim="adamw_torch",
                     seed=SHARED["seed"], data_seed=SHARED["seed"], bf16=bf16, fp16=False, use_cpu=a["device"] == "cpu",
                     packing=False, padding_free=a["pack"], dataset_kwargs={"skip_prepare_dataset": True},
                     max_length=None, gradient_checkpointing=False, use_liger_kernel=liger,
                     logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
                     dataloader_num_workers=0)


def run_trl(a: dict, work: Path, liger: bool) -> dict:
    """TRL's SFTTrainer on mens' rows in mens' order; timed by a callback that synchronizes at every step end."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from torch.utils.data import SequentialSampler
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from mens.model.load import load_tokenizer

    if a["device"] == "cpu" and a["threads"]:
        torch.set_num_threads(a["threads"])
    tok = load_tokenizer(a["model_dir"])
    rows, steps = _trl_rows(a, tok)
    ds = Dataset.from_list([_flat(rows[i]) for step in steps for i in step])
    model = _trl_model(a)
    # mens' own choice when a mens run of this shape came first, else peft's every-linear-layer-but-the-head
    targets = a.get("targets") or {"target_modules": "all-linear"}
    lora = LoraConfig(r=SHARED["r"], lora_alpha=SHARED["lora_alpha"],
                      lora_dropout=a.get("lora_dropout", SHARED["lora_dropout"]), bias="none", task_type="CAUSAL_LM",
                      **targets)
    clock = StepClock(a["device"], a.get("profile", 0), a["warmup"])

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            clock.start()

        def on_step_end(self, args, state, *_, **__):
            s = steps[state.global_step - 1]
            clock.step(sum(sum(len(e.ids) for e in rows[i]) for i in s),
                       sum(sum(e.n_supervised for e in rows[i]) for i in s), None)

        def on_log(self, args, state, control, logs=None, **_):
            if logs and "loss" in logs and clock.steps:
                clock.steps[-1]["loss"] = logs["loss"]

    class InOrderSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, *_, **__):  # mens' batch order (the dataset already lists it)
            return SequentialSampler(self.train_dataset)

    trainer = InOrderSFTTrainer(model=model, args=trl_config(a, work / "trl", liger), train_dataset=ds,
                                processing_class=tok, peft_config=lora, callbacks=[Clock()])
    first = _trl_first_loss(trainer, rows[0], a["device"])
    trainer.train()
    return {"first_batch_loss": first, "peft_targets": targets, "packed_rows": len(rows),
            "liger": liger, "trl_metrics": "entropy and mean_token_accuracy: computed every step by trl's "
            "SFTTrainer.compute_loss (no SFTConfig option turns them off in the installed trl)",
            **clock.timed(a["warmup"])}


def _trl_first_loss(trainer, row, device: str) -> float:
    """TRL's loss (its collator, its compute_loss) on mens' first packed row, eval mode, before any update."""
    import torch

    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in trainer.data_collator([_flat(row)]).items()}
    model = trainer.model
    model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
    model.train()
    return float(loss)


def worker(a: dict) -> dict:
    """One run: reset the peak counters, train, return the record (errors are recorded, not raised)."""
    import tempfile

    import torch

    t0, baseline = time.time(), 0
    if a["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    with tempfile.TemporaryDirectory() as tmp:
        side = a["side"]
        r = (run_mens(a, Path(tmp)) if side.startswith("mens")
             else run_trl(a, Path(tmp), liger=side == "trl-liger"))
    return {**r, **memory(a["device"], baseline), "process_s": round(time.time() - t0, 1)}


def run_jobs(jobs: list[dict], deadline: float | None = None) -> None:
    """Several runs in this one process (imports paid once: the smoke test, and `--grouped` timed runs); each builds
    its model if missing, and a failure is recorded in its result file instead of stopping the rest. A run that
    would end after `deadline` (its job's `est_s`, or the last measured run of its kind) is recorded as skipped."""
    import gc
    import traceback

    import torch

    targets: dict[str, dict] = {}
    took: dict[tuple, float] = {}
    for job in jobs:
        kind = (job["shape"], job["backend"], job["side"])
        need = took.get(kind, job.get("est_s", 0.0))
        if deadline and time.time() + need > deadline:
            rec = {"skipped": f"budget: needs ~{need:.0f} s, {max(0.0, deadline - time.time()):.0f} s left"}
            Path(job["result"]).write_text(json.dumps(rec))
            continue
        t0 = time.time()
        try:
            if not (Path(job["model_dir"]) / "bench_meta.json").is_file():
                prepare(job["shape"], job["tiny"], job["device"], Path(job["model_dir"]))
            rec = worker({**job, "targets": job.get("targets") or targets.get(job["shape"])})
            if job["side"] == "mens" and rec.get("peft_targets"):
                targets.setdefault(job["shape"], rec["peft_targets"])
        except Exception as e:  # noqa: BLE001  (recorded with its traceback, then the next run)
            rec = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(rec["traceback"], flush=True)
        took[kind] = time.time() - t0
        rec.setdefault("wall_s", round(took[kind], 1))
        Path(job["result"]).write_text(json.dumps(rec))
        print(json.dumps({"run": job["result"], **{k: rec.get(k) for k in (
            "supervised_tokens_per_s", "peak_allocated_mb", "first_batch_loss", "wall_s", "error")}}), flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
