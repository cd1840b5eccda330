"""`mens train` end to end: preflight (cheap checks first), load, attach adapters, the loop, the run directory.

Run: `mens train --data-dir D --output-dir O` (or `torchrun --nproc_per_node N -m mens train ...`).
Every rank runs the same checks; only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mens.errors import ConfigError, DataError, ModelError
from mens.model.chat_template import save_tokenizer
from mens.model.load import load_base, load_tokenizer, model_dir_problems, resolve_model, weights_sha256
from mens.run_records import (
    ADAPTER_WEIGHTS,
    FULL_WEIGHTS,
    MANIFEST,
    MODEL_CARD,
    SUMMARY,
    SYSTEM_PROMPT,
    TELEMETRY,
    RunSummary,
    TrainingManifest,
)
from mens.train import distributed, fsdp
from mens.train.allocator import in_use
from mens.train.checkpoint import apply_checkpoint, newest_good, save_final_weights
from mens.train.config import TrainConfig
from mens.train.data import (
    BatchPlan,
    build_rows,
    file_sha256,
    packing_order,
    plan_steps,
    read_examples,
    resolve_data_file,
    split_validation,
)
from mens.train.host_memory import fix_mmap_threshold, host_memory_note
from mens.train.loop import LoopState, train_loop
from mens.train.manifest import EXECUTION_KERNEL, adapter_record, contract_digest, peak_memory_mb, versions
from mens.train.micro_batch import fit_micro_batch
from mens.train.packing import Row
from mens.train.preflight import Preflight, embedding_problem, first_loss, packing_problem, vocab_problem
from mens.train.probe import choose_checkpointing
from mens.train.run_config import resume_problem, taken_problem, write_run_config
from mens.train.schedule import effective_warmup, make_scheduler
from mens.train.telemetry import Telemetry
from mens.train.text import Example, default_system_prompt


@dataclass
class Inputs:
    """Everything preflight resolved before the model is loaded."""

    model_dir: Path
    model_id: str
    model_config: dict
    tokenizer: object
    system_prompt: str | None
    data_path: Path
    data_sha256: str
    base_sha256: str
    digest: str
    n_rows: int
    skipped: dict
    train: list[Example]
    val: list[Example]
    rows: list[Row]
    val_rows: list[Row]
    plan: BatchPlan


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch; use --device cpu or auto")
    return device


ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "DEFAULT", "ALL")
"""oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that keep its bf16 dot-product instructions; a lower cap (AVX2, AVX512_CORE,
...) makes oneDNN emulate bf16 even on a CPU that has it."""


def cpu_has_native_bf16(environ: dict | None = None) -> bool:
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo (Linux), unless ONEDNN_MAX_CPU_ISA caps oneDNN, which runs CPU bf16
    matmuls, below them. Elsewhere False: oneDNN then emulates bf16, slower than f32.

    The cap is also how a bf16 CPU runs the f32 path an AVX2-only CPU takes (with ATEN_CPU_CAPABILITY=avx2 for
    torch's own kernels): `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 scripts/mens dogfood` (docs/dogfood.md).
    """
    cap = (os.environ if environ is None else environ).get(ONEDNN_ISA_ENV, "").strip().upper()
    if cap and cap not in ONEDNN_BF16_ISAS:
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_dtype(setting: str, device: str, backend: str) -> str | None:
    """"bf16" when matmuls should run under bf16 autocast, None for f32 (see TrainConfig.autocast)."""
    import torch

    cuda_bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
    if setting == "auto":
        # Every backend on a bf16 GPU. A LoRA/QLoRA base computes in bf16 anyway, but peft casts each adapted
        # projection's input to the f32 adapter dtype: without autocast the adapter path runs, and saves its inputs
        # for backward, in f32 (on an H200, Qwen2.5-0.5B at 2 x 2048 tokens, mens then peaked at 1.17-1.19x the
        # memory of TRL, which trains under bf16 autocast; bench/results/gpu_train_speed-h200.json).
        return "bf16" if cuda_bf16 else None
    if setting == "bf16":
        # On CPU, measured on SmolLM2-135M LoRA (Zen 4, 2 cores): 1.3-1.4x the tokens/s of f32, same loss curve.
        return "bf16" if cuda_bf16 or (device == "cpu" and cpu_has_native_bf16()) else None
    return None


def param_groups(model, lr: float, lora_plus_ratio: float) -> list[dict]:
    """The optimizer's parameter groups: every trainable tensor at `lr`, except that with LoRA+ (ratio > 1) the
    adapters' B matrices get `lr * ratio` in a second group. The scheduler scales both groups alike."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if lora_plus_ratio == 1.0:
        return [{"params": [p for _, p in named], "lr": lr}]
    rest, b = [], []
    for n, p in named:
        (b if ".lora_B." in n or ".lora_embedding_B." in n else rest).append(p)
    if not b:
        raise ConfigError(f"optimizer.lora_plus_ratio is {lora_plus_ratio:g}, but the model has no LoRA B matrices "
                          "to give it to; set it to 1 or use a LoRA backend")
    return [{"params": rest, "lr": lr}, {"params": b, "lr": lr * lora_plus_ratio}]


def _autocast(dtype: str | None, device: str):
    import torch

    if dtype == "bf16":  # f32 master weights and optimizer state, bf16 matmuls
        return lambda: torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def _read_data(cfg: TrainConfig, tokenizer, system_prompt):
    path = resolve_data_file(cfg.data.path)
    examples, skipped, n = read_examples(path, tokenizer, seq_len=cfg.seq_len, ce_last_k=cfg.ce_last_k,
                                         system_prompt=system_prompt, min_rating=cfg.min_rating,
                                         max_per_answer=cfg.data.max_per_answer)
    if len(examples) < cfg.min_examples:
        raise DataError(f"{path}: {len(examples)} usable examples of {n} rows (skipped: {skipped or 'none'}); "
                        f"at least {cfg.min_examples} are needed (--min-examples). Add data with `mens corpus pairs`")
    return path, examples, skipped, n


def prepare_inputs(cfg: TrainConfig, pf: Preflight, world: int) -> Inputs:
    """Cheap preflight: model directory, tokenizer vs embeddings, data records; then split, pack, plan."""
    system_prompt = default_system_prompt() if cfg.system_prompt is None else (cfg.system_prompt or None)
    pf.run("data file", resolve_data_file, cfg.data.path)  # before any model work (the embedded one converts once)
    model_dir, model_id = pf.run("model", resolve_model, cfg.model.name)
    if problems := model_dir_problems(model_dir):
        pf.fail("model files", ModelError("; ".join(problems) + ". Point --model at a complete HF model directory"))
    pf.ok("model files", str(model_dir))
    model_config = json.loads((model_dir / "config.json").read_text())
    tokenizer = pf.run("tokenizer", load_tokenizer, model_dir)
    if msg := vocab_problem(tokenizer, model_config):
        pf.fail("tokenizer/embedding", ModelError(f"{model_dir}: {msg}"))
    data_path, examples, skipped, n_rows = pf.run("data", _read_data, cfg, tokenizer, system_prompt)
    data_sha = file_sha256(data_path)
    base_sha = weights_sha256(model_dir) if any(model_dir.glob("*.safetensors")) else "unknown"
    pf.contract_digest = digest = contract_digest(cfg.to_dict(), data_sha, base_sha)
    train, val = split_validation(examples, cfg.val_fraction, cfg.seed)
    packed = packing_order(train, cfg.seed) if cfg.pack and cfg.data.pack_shuffle else train
    rows = build_rows(packed, pack=cfg.pack, seq_len=cfg.seq_len)
    val_rows = build_rows(val, pack=cfg.pack, seq_len=cfg.seq_len)
    plan = plan_steps(len(rows), cfg.batch_size * cfg.grad_accum * world, epochs=cfg.epochs,
                      max_steps=cfg.max_steps, seed=cfg.seed)
    return Inputs(model_dir, model_id, model_config, tokenizer, system_prompt, data_path, data_sha, base_sha, digest,
                  n_rows, skipped, train, val, rows, val_rows, plan)


def build_model(cfg: TrainConfig, inp: Inputs, device: str, pf: Preflight, *, checkpointing: bool):
    """The heavy part: base weights (NF4 for qlora), then LoRA adapters (seeded) or all weights trainable."""
    import torch

    model = pf.run("load model", load_base, inp.model_dir, backend=cfg.backend, device=device)
    if msg := embedding_problem(model, inp.model_config):
        pf.fail("tokenizer/embedding", ModelError(f"{inp.model_dir}: {msg}"))
    pf.ok("tokenizer/embedding",
          f"{len(inp.tokenizer)} tokens <= {model.get_input_embeddings().weight.shape[0]} embedding rows")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    torch.manual_seed(cfg.seed)  # adapter init is part of the run's seeded state
    if cfg.backend == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from mens.model.lora import attach_lora

    model = pf.run("target modules", attach_lora, model, r=cfg.r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                   strict=cfg.strict_targets, top_layers=cfg.lora_layers)
    if cfg.init_adapter:
        pf.run("init adapter", _init_adapter, model, Path(cfg.init_adapter))
    return model


def _init_adapter(model, adapter_dir: Path) -> str:
    """Copy a previous run's LoRA tensors into the fresh adapter; its shapes and names must match exactly."""
    from safetensors.torch import load_file

    from mens.model.lora import adapter_state, load_adapter_weights

    path = adapter_dir / "adapter_model.safetensors"
    if not path.is_file():
        raise ModelError(f"--init-adapter {adapter_dir}: no adapter_model.safetensors there; pass a run directory")
    saved, fresh = load_file(str(path)), adapter_state(model)
    bad = sorted(k for k in fresh if k not in saved or saved[k].shape != fresh[k].shape)
    if bad or set(saved) - set(fresh):
        raise ModelError(f"--init-adapter {adapter_dir}: its tensors do not match this adapter ({len(bad)} missing or "
                         f"reshaped, e.g. {(bad or sorted(set(saved) - set(fresh)))[0]}); use the same base, rank "
                         "and target modules")
    load_adapter_weights(model, adapter_dir)
    return f"{len(saved)} tensors from {path}"


def add_embedding_noise(model, alpha: float, pf: Preflight) -> None:
    """NEFTune through transformers' own forward hook: noise on the input embeddings in training mode only, so
    validation loss, the saved weights and everything after training see the plain model. The noise draws from the
    dropout stream, which checkpoints save, so a resumed run draws the same noise."""
    from transformers.integrations.neftune import neftune_post_forward_hook

    emb = model.get_input_embeddings()
    emb.neftune_noise_alpha = alpha
    emb.register_forward_hook(neftune_post_forward_hook)
    pf.ok("embedding noise", f"NEFTune alpha {alpha:g} on {type(emb).__name__} (training steps only)")


def numeric_checks(cfg: TrainConfig, inp: Inputs, model, device: str, autocast, pad_id: int, pf: Preflight) -> float:
    """Finite loss on the first row before any update (packing isolation is `choose_packing`'s check)."""
    import math

    loss0 = first_loss(model, inp.rows[:1], pad_id, device, autocast)
    if not math.isfinite(loss0):
        pf.fail("first loss", ModelError(f"{inp.model_dir}: the first batch's loss is {loss0} (not finite) before "
                                         "any update; the weights or the dtype are broken (try --backend lora)"))
    pf.ok("first loss", f"{loss0:.4f}")
    return loss0


def choose_packing(cfg: TrainConfig, inp: Inputs, model, device: str, autocast, pf: Preflight) -> dict:
    """Keep packed rows where this model keeps packed examples apart; otherwise fall back to one example per row
    (re-planning the steps) with a one-line note, never a refusal. Returns the manifest's `packing` record."""
    import warnings

    from mens.train.packing import has_recurrent_layers

    if not cfg.pack:
        return {"mode": "off"}
    problem = packing_problem(model, device, autocast, len(inp.tokenizer))
    if problem is None:
        from mens.train.segment_attention import uses_segment_attention

        # varlen: flattened for recurrent layers; segments: flattened, attended example by example; position_ids:
        # (B, T) rows whose block mask transformers builds from the position ids
        mode = ("varlen" if has_recurrent_layers(model) else "segments" if uses_segment_attention(model)
                else "position_ids")
        pf.ok("packing isolation", f"packed rows keep examples apart ({mode}; checked on 2 rows x 2 examples)")
        return {"mode": mode}
    note = (f"packing off for {inp.model_config.get('model_type')}: {problem}; training on one example per row "
            "(--no-pack silences this note)")
    warnings.warn(note, stacklevel=2)
    inp.rows = build_rows(inp.train, pack=False, seq_len=cfg.seq_len)
    inp.val_rows = build_rows(inp.val, pack=False, seq_len=cfg.seq_len)
    inp.plan = plan_steps(len(inp.rows), inp.plan.global_batch, epochs=cfg.epochs, max_steps=cfg.max_steps,
                          seed=cfg.seed)
    pf.ok("packing isolation", note)
    return {"mode": "unpacked", "note": note}


def _resume(cfg: TrainConfig, run: Path, inp: Inputs, model, optimizer, scheduler, rank: int,
            refits: list, carried: dict) -> tuple[int, str | None]:
    """Continue from the newest checkpoint that verifies and loads; each newer one skipped gets one printed line.
    A run fitted to its time limit continues its re-fitted learning-rate curve and step count (`refits`); one with
    `data.second_pass` "hardest" its first-pass losses and second-pass order (into `carried`, and the plan)."""
    if not cfg.resume:
        return 0, None
    loaded, skipped = newest_good(run, model=model, backend=cfg.backend, optimizer=optimizer, scheduler=scheduler)
    if rank == 0:
        for reason in skipped:
            then = f"resuming from {loaded.path.name}" if loaded else "no older checkpoint"
            print(f"{reason}; {then}", file=sys.stderr, flush=True)
    if loaded is None:
        if skipped:
            raise DataError(f"--resume: no usable checkpoint in {run / 'checkpoints'} ({'; '.join(skipped)}); start "
                            "again with a new --output-dir, or resume with the mens version that wrote them")
        return 0, None
    state, ckpt = loaded.state, loaded.path
    # resume_digest leaves out what may change on resume (config.RESUMABLE: max_steps, save_every...); a checkpoint
    # without one is compared by the full contract digest
    key, want = (("resume_digest", resume_digest(cfg, inp)) if "resume_digest" in state
                 else ("contract_digest", inp.digest))
    if state.get(key) != want:
        raise ConfigError(f"--resume: {ckpt} was written with other settings, data or base weights ({key} "
                          f"{str(state.get(key))[:12]} != {want[:12]}); resume with the same "
                          "flags and data, or start a new --output-dir")
    if state.get("global_batch") != inp.plan.global_batch:
        raise ConfigError(f"--resume: global batch {inp.plan.global_batch} != {state.get('global_batch')} saved in "
                          f"{ckpt}; keep batch_size x grad_accum x processes the same")
    apply_checkpoint(loaded, model=model, backend=cfg.backend, optimizer=optimizer, scheduler=scheduler, rank=rank)
    if cfg.fit_to_time and state.get("refits"):  # checked when read (mens.train.checkpoint.read_checkpoint)
        refits[:] = state["refits"]
        inp.plan.total_steps = max(int(state["step"]), refits[-1][1])
    if cfg.data.second_pass == "hardest":  # checked when read, and the data by the digest above
        carried["first_pass_losses"] = list(state.get("first_pass_losses", []))
        if state.get("second_pass") is not None:
            if len(state["second_pass"]) != inp.plan.n_rows:
                raise ConfigError(f"--resume: {ckpt} orders {len(state['second_pass'])} rows for the second pass, "
                                  f"this data packs {inp.plan.n_rows}; resume with the same data and settings")
            carried["second_pass"] = inp.plan.second_pass = list(state["second_pass"])
    return int(state["step"]), ckpt.name


def resume_digest(cfg: TrainConfig, inp: Inputs) -> str:
    """The contract digest without the settings that may change on resume."""
    return contract_digest(cfg.contract_values(), inp.data_sha256, inp.base_sha256)


def _manifest(cfg, inp: Inputs, *, run_id, device, world, warmup, start_step, resumed_from, model, amp,
              parallelism, checkpointing, packing) -> TrainingManifest:
    return TrainingManifest(
        run_id=run_id, backend=cfg.backend,
        base_model=inp.model_id, base_model_id=inp.model_id, base_model_path=str(inp.model_dir),
        base_weights_sha256=inp.base_sha256, model_type=inp.model_config.get("model_type"),
        vocab_size=inp.model_config.get("vocab_size"), data=str(inp.data_path),
        data_files=[str(inp.data_path)], data_sha256=inp.data_sha256, system_prompt=inp.system_prompt,
        chat_template=inp.tokenizer.chat_template, config=cfg.to_dict(), contract_digest=inp.digest,
        execution_kernel=EXECUTION_KERNEL, versions=versions(), device=device, world_size=world,
        matmul_dtype=amp or "f32",
        seeds={"seed": cfg.seed, "adapter_init": "seed", "dropout": "seed+1", "data_order": "seed*1000+epoch",
               "val_split": "seed^0xA1B2C3D4"},
        examples={"rows_read": inp.n_rows, "train": len(inp.train), "val": len(inp.val), "skipped": inp.skipped,
                  "train_rows": len(inp.rows), "val_rows": len(inp.val_rows)},
        steps={"planned": inp.plan.total_steps, "steps_per_epoch": inp.plan.steps_per_epoch,
               "global_batch": inp.plan.global_batch, "warmup": warmup, "completed": start_step,
               "resumed_from": resumed_from},
        target_modules=None if cfg.backend == "full" else (adapter_record(model) or {}).get("modules"),
        adapter=adapter_record(model), parallelism=parallelism, gradient_checkpointing=checkpointing,
        packing=packing, started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _summary(cfg, inp: Inputs, st: LoopState, *, run_id, device, world, start_step, loss0, wall) -> RunSummary:
    tail = st.losses[-10:]
    weights = FULL_WEIGHTS if cfg.backend == "full" else ADAPTER_WEIGHTS
    return RunSummary(
        run_id=run_id, base_model=inp.model_id, backend=cfg.backend,
        steps=st.step, global_step=st.step, optimizer_step_count=st.step, steps_this_session=st.step - start_step,
        stopped_early=st.stopped_early,
        final_loss=st.last_loss, first_loss=loss0,
        avg_train_loss=sum(st.losses) / len(st.losses) if st.losses else None,
        avg_train_loss_last10=sum(tail) / len(tail) if tail else None,
        val_loss=st.last_val_loss, avg_val_loss_last_epoch=st.last_val_loss,
        total_tokens=st.input_tokens, supervised_tokens=st.supervised_tokens,
        wall_time_s=round(wall, 2), train_time_s=round(st.train_seconds, 2),
        tokens_per_s=round(st.input_tokens / st.train_seconds, 1) if st.train_seconds else None,
        peak_memory=peak_memory_mb(device), world_size=world,
        # mens's names (weights, telemetry, manifest) and the original's (final_adapter, telemetry_jsonl,
        # model_card; it also lists training_skip_stats, a file mens does not write)
        artifacts={"weights": weights, "telemetry": TELEMETRY, "manifest": MANIFEST,
                   "final_adapter": None if cfg.backend == "full" else ADAPTER_WEIGHTS,
                   "telemetry_jsonl": TELEMETRY, "model_card": MODEL_CARD})


def _spare_gb(cfg: TrainConfig, inp: Inputs, device: str, checkpointing: bool) -> float | None:
    """What the run's memory estimate leaves of this process's share (probe.FIT_SHARE of it), or None if unknown."""
    from mens.train.probe import FIT_SHARE, estimate_memory_gb

    memory = fsdp.process_memory_gb(device)
    if memory is None:
        return None
    est = estimate_memory_gb(inp.model_config, backend=cfg.backend, r=cfg.r, seq_len=cfg.seq_len,
                             batch_size=cfg.batch_size, gradient_checkpointing=checkpointing)["total_gb"]
    return FIT_SHARE * memory - est


def run_training(cfg: TrainConfig, *, val_share: float = 1.0) -> dict:
    """Train and write the run directory; returns the run summary (empty on ranks other than 0). `val_share` < 1:
    validate on that share of the validation rows only (a run that is timed, or one whose time is budgeted; see
    train_loop)."""
    import torch

    wall0 = time.time()
    device = resolve_device(cfg.device)
    d = distributed.setup("cuda" if device == "cuda" else "cpu")
    if device == "cuda" and d.world > 1:
        device = f"cuda:{d.local_rank}"
        torch.cuda.set_device(device)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    allocator = in_use()
    # before the model's allocations; glibc's threshold means nothing to mimalloc, which already peaks about as low
    heap = fix_mmap_threshold() if cfg.host_memory == "lean" and allocator == "system" else None
    run = Path(cfg.output_dir)
    problem = (taken_problem(cfg) or resume_problem(cfg)) if d.main else None
    if distributed.all_sum(d, [float(problem is not None)])[0]:  # decided by rank 0 for every rank
        raise ConfigError(problem or "rank 0 refused the run directory or the --resume settings (see its error)")
    if d.main:
        write_run_config(cfg)  # before preflight: even a run that fails early records what it was asked to do
    pf = Preflight(run, write=d.main)
    pf.ok("host memory", host_memory_note(cfg.host_memory, allocator, heap))
    inp = prepare_inputs(cfg, pf, d.world)

    checkpointing, why = choose_checkpointing(
        cfg.gradient_checkpointing, model_config=inp.model_config, backend=cfg.backend, r=cfg.r, seq_len=cfg.seq_len,
        batch_size=cfg.batch_size, memory_gb=fsdp.process_memory_gb(device))
    pf.ok("gradient checkpointing", why)
    model = build_model(cfg, inp, device, pf, checkpointing=checkpointing)
    amp = autocast_dtype(cfg.autocast, device, cfg.backend)
    autocast = _autocast(amp, device)
    own_attention = None
    if cfg.pack:  # before the packing check, which then checks this attention's isolation too
        from mens.train.segment_attention import bind_segment_attention

        own_attention, note = bind_segment_attention(model, device, autocast, len(inp.tokenizer))
        if note:
            pf.ok("attention", note)
    packing = choose_packing(cfg, inp, model, device, autocast, pf)  # before the plan is used: it may re-plan
    shard, parallelism = fsdp.choose(cfg.fsdp, world=d.world, device=device, model_config=inp.model_config,
                                     backend=cfg.backend, r=cfg.r, seq_len=cfg.seq_len, batch_size=cfg.batch_size,
                                     gradient_checkpointing=checkpointing)
    if distributed.all_sum(d, [float(shard and d.main)])[0]:  # rank 0 decides for every rank
        parallelism += "; sharded " + pf.run("fsdp", fsdp.shard_model, model, device)
        d.sharded = True  # before the optimizer: it must hold the sharded parameters
    pf.ok("parallelism", parallelism)
    groups = param_groups(model, cfg.learning_rate, cfg.lora_plus_ratio if cfg.backend != "full" else 1.0)
    params = [p for g in groups for p in g["params"]]
    if len(groups) > 1:
        pf.ok("optimizer", f"AdamW, LoRA+: {len(groups[1]['params'])} B matrices at {cfg.lora_plus_ratio:g}x the "
              f"learning rate ({groups[1]['lr']:.3g}), the rest at {groups[0]['lr']:.3g}")
    # fused: one CUDA kernel for the whole update instead of several per parameter tensor (the same math)
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.weight_decay, fused=device.startswith("cuda") or None)
    warmup = effective_warmup(cfg.warmup_steps, inp.plan.total_steps)
    refits: list = []  # [step, new total] of a run fitted to its time limit; the scheduler reads it every step
    scheduler = make_scheduler(optimizer, warmup=warmup, total=inp.plan.total_steps, refits=refits)
    emulated = "; this CPU has no native bf16, so f32" if cfg.autocast == "bf16" and amp is None else ""
    pf.ok("matmul precision", f"{amp or 'f32'} (autocast: {cfg.autocast}{emulated})")
    if amp and cfg.backend != "full":
        from mens.model.lora import keep_inputs_in_autocast_dtype

        keep_inputs_in_autocast_dtype(model)
    pad_id = inp.tokenizer.pad_token_id if inp.tokenizer.pad_token_id is not None else 0
    from mens.train import int8_base

    int8_swapped, int8_note = int8_base.bind_for_training(
        model, setting=cfg.int8_base, device=device, amp=amp, backend=cfg.backend, sharded=d.sharded,
        calibrate=lambda: first_loss(model, inp.rows[:4], pad_id, device, autocast))
    if int8_note:
        pf.ok("int8 base", int8_note)
    from mens.train import bf16_base

    spare = _spare_gb(cfg, inp, device, checkpointing) if device == "cpu" and amp == "bf16" else None
    bf16_swapped, bf16_note = bf16_base.bind_for_training(model, amp=amp, device=device, backend=cfg.backend,
                                                          sharded=d.sharded, spare_gb=spare)
    if bf16_note:
        pf.ok("bf16 base", bf16_note)
    if cfg.backend != "full" and not d.sharded:
        from mens.train.lora_mlp import fuse_lora_mlps

        if fused := fuse_lora_mlps(model, autocast):
            pf.ok("fused LoRA MLP", fused)
        from mens.train.flat_4bit import flatten_4bit_bases

        if flat := flatten_4bit_bases(model):
            pf.ok("4-bit absmax", flat)
    from mens.train.kernels import layer_kernels

    if kernels := layer_kernels(model, device, autocast):
        pf.ok("layer kernels", kernels)
    loss0 = numeric_checks(cfg, inp, model, device, autocast, pad_id, pf)
    micro_rows, micro_why = fit_micro_batch(  # before the dropout stream is seeded: it runs one pass
        cfg.micro_batch, model=model, rows=inp.rows, batch_size=cfg.batch_size, grad_accum=cfg.grad_accum,
        world=d.world, device=device, memory_gb=fsdp.process_memory_gb(device), pad_id=pad_id, autocast=autocast)
    pf.ok("micro-batch", micro_why)
    if cfg.neftune_alpha:  # after the numeric checks: the packing-leak check compares two noiseless passes
        add_embedding_noise(model, cfg.neftune_alpha, pf)
    carried: dict = {}  # what a resumed run continues besides the weights and re-fits (`_resume`)
    start_step, resumed_from = _resume(cfg, run, inp, model, optimizer, scheduler, d.rank, refits, carried)
    if resumed_from is None:
        torch.manual_seed(cfg.seed + 1)  # the dropout stream; a resumed run continues the checkpoint's RNG

    old = TrainingManifest.read_optional(run / MANIFEST) if resumed_from else None
    run_id = (old.run_id if old else "") or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    manifest = _manifest(cfg, inp, run_id=run_id, device=device, world=d.world, warmup=warmup,
                         start_step=start_step, resumed_from=resumed_from, model=model,
                         amp=f"{amp or 'f32'}, int8 frozen base" if int8_swapped else amp,
                         parallelism="fsdp" if d.sharded else "ddp-allreduce" if d.world > 1 else "single",
                         checkpointing={"on": checkpointing, "why": why}, packing=packing)
    manifest.steps.update(micro_batch_rows=micro_rows, micro_batch=micro_why,
                          passes_per_step=-(-cfg.batch_size * cfg.grad_accum // micro_rows))
    tel = Telemetry(run, enabled=d.main)
    if d.main:
        pf.write()
        manifest.write(run / MANIFEST)
        save_tokenizer(inp.tokenizer, run, inp.system_prompt)
        if cfg.backend == "full" and inp.system_prompt:
            (run / SYSTEM_PROMPT).write_text(inp.system_prompt, encoding="utf-8")
    plan = inp.plan
    tel.emit("train_start", run_id=run_id, train_file=str(inp.data_path), output=str(run), seed=cfg.seed,
             backend=cfg.backend, model=inp.model_id, device=device, world_size=d.world,
             planned_steps=plan.total_steps, steps_per_epoch=plan.steps_per_epoch, epochs=cfg.epochs,
             batch_size=cfg.batch_size, grad_accum=cfg.grad_accum, global_batch=plan.global_batch,
             warmup_steps=warmup, train_examples=len(inp.train), val_examples=len(inp.val),
             train_rows=len(inp.rows), resumed_from_step=start_step or None, first_loss=loss0)
    ckpt_state = {"run_id": run_id, "contract_digest": inp.digest, "resume_digest": resume_digest(cfg, inp),
                  "global_batch": plan.global_batch,
                  "world_size": d.world, "total_steps": plan.total_steps, "refits": refits, **carried}
    try:
        st = train_loop(model=model, optimizer=optimizer, scheduler=scheduler, params=params, rows=inp.rows,
                        val_rows=inp.val_rows, plan=plan, cfg=cfg, run_dir=run, d=d, device=device,
                        autocast=autocast, pad_id=pad_id, start_step=start_step, telemetry=tel, ckpt_state=ckpt_state,
                        micro_rows=micro_rows, refits=refits, warmup=warmup, val_share=val_share)
    except BaseException as e:
        tel.emit("train_failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        int8_base.restore(int8_swapped)  # the saved adapter, eval and merge see the f32 base
        bf16_base.restore(bf16_swapped)
        if own_attention is not None:  # a later use of this model in the process (eval, generation) gets its own
            from mens.train.segment_attention import restore_attention

            restore_attention(model, own_attention)
    weights = fsdp.full_weights(model, cfg.backend) if d.sharded else None  # every rank joins the gather
    summary: RunSummary | None = None
    if d.main:
        save_final_weights(model, run, cfg.backend, weights, step=st.step, loss=st.last_loss)
        wall = time.time() - wall0
        summary = _summary(cfg, inp, st, run_id=run_id, device=device, world=d.world, start_step=start_step,
                           loss0=loss0, wall=wall)
        manifest.steps["completed"] = st.step
        if refits:  # a time-fitted run: the learning-rate curve it trained, as (step, total) re-fits
            manifest.steps["refits"] = refits
        manifest.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
        manifest.write(run / MANIFEST)
        summary.write(run / SUMMARY)
        tel.emit("train_complete", step=st.step, final_loss=st.last_loss, val_loss=st.last_val_loss,
                 wall_time_s=round(wall, 2), tokens=st.input_tokens, tokens_per_s=summary.tokens_per_s)
    distributed.barrier(d)
    distributed.teardown(d)
    return summary.to_json() if summary else {}
