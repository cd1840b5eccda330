"""Checkpoints: `checkpoints/step-N/` with weights (adapter or full), optimizer, scheduler, RNG and the data
cursor, written to a temporary directory and renamed into place (a crash never leaves half a checkpoint).
An FSDP-sharded run writes the same files: rank 0 gets full tensors gathered by `mens.train.fsdp` first.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from mens.errors import DataError

STATE = "state.json"


def save_weights(model, out: Path, backend: str, state: dict | None = None) -> None:
    """Full HF weights or the PEFT adapter; `state`: full tensors gathered from a sharded model (None = the model's)."""
    if backend == "full":
        model.save_pretrained(out, safe_serialization=True, state_dict=state)
    else:
        from mens.model.lora import save_adapter

        save_adapter(model, out, state)


def capture_rng() -> dict:
    """This process's RNG streams (torch CPU, CUDA, python, numpy)."""
    import numpy as np
    import torch

    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(run_dir: Path, step: int, *, model, backend: str, optimizer, scheduler, state: dict,
                    keep: int, rng_by_rank: list[dict] | None = None, weights: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write checkpoints/step-{step} atomically; prune to the newest `keep` (0 = keep all).

    `weights` / `optimizer_state`: full tensors gathered from an FSDP-sharded model (None = read the objects).
    """
    import torch

    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_weights(model, tmp, backend, state=weights)
    torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save({"ranks": rng_by_rank or [capture_rng()]}, tmp / "rng.pt")  # one entry per process
    (tmp / STATE).write_text(json.dumps({**state, "step": step, "saved_at_unix": time.time()}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (they have state.json), oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if (p / STATE).is_file() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(ckpt: Path, *, model, backend: str, optimizer, scheduler, rank: int = 0) -> dict:
    """Restore weights, optimizer, scheduler and this rank's RNG in place; return the saved state (step, cursor).

    The files hold full tensors; a sharded (FSDP) model and its optimizer keep only their shards of them.
    """
    import torch

    from mens.train.fsdp import load_optimizer_state, loading_full_tensors

    with loading_full_tensors(model):
        if backend == "full":
            from safetensors.torch import load_file

            sd = {}
            for f in sorted(ckpt.glob("*.safetensors")):
                sd.update(load_file(str(f)))
            missing, unexpected = model.load_state_dict(sd, strict=False)
            if unexpected:
                raise DataError(f"{ckpt}: checkpoint weights do not match the model (unexpected {unexpected[:3]})")
        else:
            from mens.model.lora import load_adapter_weights

            load_adapter_weights(model, ckpt)
    load_optimizer_state(optimizer, torch.load(ckpt / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    ranks = torch.load(ckpt / "rng.pt", weights_only=False)["ranks"]
    restore_rng(ranks[rank] if rank < len(ranks) else ranks[0])  # another world size: same data, new streams
    return json.loads((ckpt / STATE).read_text())
