"""Preflight: cheap checks before heavy work, each failure with a clear message; the findings are written
to `training-preflight.json` whether they pass or not.
"""

from __future__ import annotations

import math
from pathlib import Path

from mens.errors import MensError
from mens.train.manifest import EXECUTION_KERNEL, PREFLIGHT, write_json

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
    """True when this architecture lets a packed example see its neighbour (position ids not honoured)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(3, vocab, (1, 5), generator=g), torch.randint(3, vocab, (1, 6), generator=g)
    pos = torch.tensor([list(range(5)) + list(range(6))])
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast():
        packed = model(input_ids=torch.cat([a, b], 1).to(device), position_ids=pos.to(device), use_cache=False).logits
        alone = model(input_ids=b.to(device), use_cache=False).logits
    model.train(was_training)
    # Measured against the logits' own scale: under bf16 autocast (emulated on CPUs without native bf16) an
    # isolated example still differs by ~1% of the largest logit from kernel blocking, while a leak moves the
    # logits by about their whole scale (the first token of `b` sees five more tokens).
    diff = (packed[0, 5:].float() - alone[0].float()).abs().max()
    return bool(diff > 0.05 * alone.float().abs().max() + 1e-3)
