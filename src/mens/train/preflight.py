"""Preflight: cheap checks before heavy work, each failure with a clear message; the findings are written
to `training-preflight.json` whether they pass or not.
"""

from __future__ import annotations

import math
from pathlib import Path

from mens.errors import MensError
from mens.run_records import PREFLIGHT, write_json
from mens.train.manifest import EXECUTION_KERNEL

PREFLIGHT_SCHEMA = "vox.mens.preflight.v0"  # the original's id (contracts/training-preflight.schema.json)


class Preflight:
    """Collects checks; `fail` records the failure, writes the report and raises the given error."""

    def __init__(self, run_dir: Path, *, write: bool):
        self.run_dir = run_dir
        self.write_enabled = write
        self.checks: list[dict] = []
        self.contract_digest: str | None = None

    def ok(self, name: str, detail: str = "") -> None:
        self.checks.append({"check": name, "ok": True, "detail": detail})

    def fail(self, name: str, error: MensError) -> None:
        self.checks.append({"check": name, "ok": False, "detail": str(error)})
        self.write()
        raise error

    def run(self, name: str, fn, *args, **kwargs):
        """Call fn; a MensError it raises becomes a failed check."""
        try:
            value = fn(*args, **kwargs)
        except MensError as e:
            self.fail(name, e)
        self.ok(name)
        return value

    def write(self) -> None:
        if not self.write_enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / PREFLIGHT, {
            "schema_version": PREFLIGHT_SCHEMA, "execution_kernel": EXECUTION_KERNEL,
            # the original's schema wants a non-empty string, also when a check failed before the digest existed
            "contract_digest": self.contract_digest or "unresolved", "passed": all(c["ok"] for c in self.checks),
            "checks": self.checks})


def vocab_problem(tokenizer, model_config: dict) -> str | None:
    """A tokenizer larger than the embedding table would index out of range."""
    vocab = model_config.get("text_config", model_config).get("vocab_size")
    if vocab is not None and len(tokenizer) > vocab:
        return (f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}; "
                "use the tokenizer that belongs to this model (or resize the embeddings first)")
    return None


def embedding_problem(model, model_config: dict) -> str | None:
    emb = model.get_input_embeddings().weight
    vocab = model_config.get("text_config", model_config).get("vocab_size")
    hidden = model_config.get("text_config", model_config).get("hidden_size")
    if emb.dim() != 2:
        return f"embedding table is {emb.dim()}-D (expected 2-D)"
    if vocab is not None and emb.shape[0] != vocab:
        return f"embedding table has {emb.shape[0]} rows but config.json says vocab_size = {vocab}"
    if hidden is not None and emb.shape[1] != hidden:
        return f"embedding width {emb.shape[1]} != config hidden_size {hidden}"
    return None


def first_loss(model, rows: list, pad_id: int, device: str, autocast) -> float:
    """Mean token loss of the first rows without gradients (must be finite before training starts)."""
    import torch

    from mens.train.packing import batch_loss_sum

    was_training = model.training
    model.eval()
    with torch.no_grad():
        total, n = batch_loss_sum(model, rows, pad_id, device, autocast)
    model.train(was_training)
    total = total.item()
    return total / max(1, n) if math.isfinite(total) else float("nan")


def packing_leaks(model, device: str, autocast, vocab: int) -> bool:
    """True when packed rows let an example see its neighbour (position ids / varlen boundaries not honoured).

    The batch is the multi-row case training sees: two rows of two examples each, the second row padded, built
    with the same inputs as a training step (`model_inputs`); every example's logits must match its own forward.
    A model that shares prompt prefixes is also checked in that layout (`packing.shared_layout_error`).
    """
    from mens.train.packing import ISOLATION_TOLERANCE, collate, isolation_error, probe_rows

    rows = probe_rows(vocab)
    exs = [ex for row in rows for ex in row]
    batch = collate(rows, 0)

    def spans(logits):
        packed = logits.reshape(*batch["input_ids"].shape, -1)  # (B, T, V) again where it was flattened
        k = 0
        for r, row in enumerate(rows):
            offset = 0
            for ex in row:
                yield k, packed[r, offset:offset + len(ex.ids)]
                offset, k = offset + len(ex.ids), k + 1

    diff, scale = isolation_error(model, device, autocast, batch, exs, spans)
    # Measured against the logits' own scale: under bf16 autocast (emulated on CPUs without native bf16) an
    # isolated example still differs by ~1% of the largest logit from kernel blocking, while a leak moves the
    # logits by about their whole scale (the first token of the second example sees five more tokens).
    if diff > ISOLATION_TOLERANCE * scale + 1e-3:
        return True
    from mens.train.packing import shared_layout_error
    from mens.train.segment_attention import shares_prefix

    # Where micro-batches share their common prefix, the layout training then uses is checked the same way.
    return shares_prefix(model) and shared_layout_error(model, device, autocast, vocab) > ISOLATION_TOLERANCE


def packing_problem(model, device: str, autocast, vocab: int) -> str | None:
    """Why packed rows cannot train this model (examples would see each other), or None when they can."""
    from mens.train.packing import has_recurrent_layers

    how = "varlen boundaries (cu_seq_lens, seq_idx)" if has_recurrent_layers(model) else "per-example position ids"
    try:
        if not packing_leaks(model, device, autocast, vocab):
            return None
    except (ValueError, TypeError) as e:  # transformers' torch fallbacks refuse varlen boundaries they cannot honour
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        kernels = (": packed linear attention needs flash-linear-attention and causal-conv1d (CUDA; mamba-ssm for "
                   "Mamba layers)") if has_recurrent_layers(model) else ""
        return f"{how} are not taken by this model's kernels ({why}){kernels}"
    return f"{how} do not keep packed examples apart in this architecture"
