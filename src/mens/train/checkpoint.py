"""Checkpoints: `checkpoints/step-N/` with weights (adapter or full), optimizer, scheduler, RNG and the data cursor,
as safetensors and JSON only (nothing in a run directory is ever unpickled or executed).

Writing: every file goes into `.tmp-step-N/`, then `checksums.json` (sha256 of each file) is written last, every
file and the directory are fsynced, and the directory is renamed into place; a crash or a full disk leaves the
previous checkpoint as it was. A step whose weights or loss are not finite is never saved.
Resuming: each checkpoint, newest first, must match its checksums and load completely (shapes, structure, finite
values) before anything is applied; a bad one is skipped with a one-line reason. An FSDP-sharded run writes the
same files: rank 0 gets full tensors gathered by `mens.train.fsdp` first.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from mens.errors import DataError, ModelError
from mens.run_records import CHECKPOINT_FORMAT, current_format
from mens.train import atomic
from mens.train.state_io import (
    StateInvalid,
    finite_number,
    first_nonfinite,
    optimizer_bytes,
    read_json,
    read_optimizer,
    read_rng,
    read_scheduler,
    rng_bytes,
    scheduler_bytes,
)

STATE = "state.json"
CHECKSUMS = "checksums.json"  # written last: a checkpoint without it was never completed
OPTIMIZER = "optimizer.safetensors"
SCHEDULER = "scheduler.json"
RNG = "rng.safetensors"
FORMAT = CHECKPOINT_FORMAT
PICKLED = ("optimizer.pt", "scheduler.pt", "rng.pt")  # what older versions wrote; refused, never unpickled


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


def step_of(ckpt: Path) -> int:
    return int(ckpt.name[5:])


def _step_dirs(run_dir: Path) -> list[Path]:
    """Every checkpoints/step-N directory, complete or not, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=step_of)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Completed checkpoints (they have checksums.json, written last), oldest first; `newest_good` verifies them."""
    return [p for p in _step_dirs(run_dir) if (p / CHECKSUMS).is_file()]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, *, model, backend: str, optimizer, scheduler, state: dict,
                    keep: int, rng_by_rank: list[dict] | None = None, weights: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write checkpoints/step-{step} atomically and durably; prune to the newest `keep` (0 = keep all).

    `weights` / `optimizer_state`: full tensors gathered from an FSDP-sharded model (None = read the objects).
    A failed write (full disk) removes the partial directory and raises a DataError; older checkpoints stay.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stray in [*root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:  # left by a crash mid-write
        shutil.rmtree(stray, ignore_errors=True)
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    try:
        _write_files(tmp, step, model=model, backend=backend, state=state, weights=weights,
                     optimizer=optimizer.state_dict() if optimizer_state is None else optimizer_state,
                     scheduler=scheduler.state_dict(), rng_by_rank=rng_by_rank or [capture_rng()])
        atomic.replace_dir(tmp, final)
    except (OSError, _safetensors_error()) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = [p.name for p in list_checkpoints(run_dir) if step_of(p) < step]
        kept = f"checkpoints/{prev[-1]} is intact" if prev else "no earlier checkpoint exists"
        raise DataError(f"{final}: writing the checkpoint failed ({_one_line(e)}); {kept}. Free disk space "
                        f"(or fix the directory), then continue with --resume") from None
    atomic.kill_point("checkpoint.renamed", step)
    for c in list_checkpoints(run_dir):
        if step_of(c) > step:  # a discarded future: this run resumed from an earlier checkpoint
            shutil.rmtree(c, ignore_errors=True)
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _safetensors_error():
    from safetensors import SafetensorError

    return SafetensorError


def _write_files(tmp: Path, step: int, *, model, backend: str, state: dict, weights, optimizer: dict,
                 scheduler: dict, rng_by_rank: list[dict]) -> None:
    """Every file of the checkpoint into `tmp`, checksums.json last (the kill points are test hooks)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    atomic.kill_point("checkpoint.start", step)
    save_weights(model, tmp, backend, state=weights)
    atomic.kill_point("checkpoint.weights", step)
    atomic.write_file(tmp / OPTIMIZER, optimizer_bytes(optimizer))
    atomic.kill_point("checkpoint.optimizer", step)
    atomic.write_file(tmp / SCHEDULER, scheduler_bytes(scheduler))
    atomic.write_file(tmp / RNG, rng_bytes(rng_by_rank))  # one entry per process
    record = {**state, "step": step, "saved_at_unix": time.time()}
    atomic.write_file(tmp / STATE, json.dumps(record, indent=2).encode())
    atomic.kill_point("checkpoint.state", step)
    files = {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())}
    atomic.write_file(tmp / CHECKSUMS, json.dumps({"format": FORMAT, "step": step, "files": files}, indent=1).encode())
    atomic.kill_point("checkpoint.checksums", step)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_files(ckpt: Path) -> None:
    """The directory holds exactly the files of its checksums.json, each with its recorded size and sha256."""
    if found := [p for p in PICKLED if (ckpt / p).exists()]:
        raise StateInvalid(f"written by an older mens ({', '.join(found)} are pickles, which are never loaded)")
    if not (ckpt / CHECKSUMS).is_file():
        raise StateInvalid(f"{CHECKSUMS} is missing (the checkpoint was never completed)")
    sums = read_json(ckpt / CHECKSUMS)
    files = sums.get("files")
    if current_format(sums.get("format")) != FORMAT or not isinstance(files, dict) or sums.get("step") != step_of(ckpt):
        raise StateInvalid(f"{CHECKSUMS} is not a {FORMAT} record for step {step_of(ckpt)}")
    present = {p.name for p in ckpt.iterdir()} - {CHECKSUMS}
    if extra := sorted(present - set(files)):
        raise StateInvalid(f"{extra[0]} is not listed in {CHECKSUMS}")
    for name, rec in files.items():
        if not isinstance(rec, dict) or not isinstance(name, str) or name != Path(name).name:
            raise StateInvalid(f"{CHECKSUMS} has a malformed entry {name!r}")
        path = ckpt / name
        if not path.is_file():
            raise StateInvalid(f"{name} is missing")
        if path.stat().st_size != rec.get("bytes") or _sha256(path) != rec.get("sha256"):
            raise StateInvalid(f"{name} checksum mismatch")


@dataclass
class Loaded:
    """A checkpoint read completely and checked, not yet applied."""

    path: Path
    state: dict
    weights: dict
    optimizer: dict
    scheduler: dict
    rng: list[dict]


def refits_problem(refits) -> str | None:
    """What is wrong with a time-fitted run's recorded re-fits (mens.train.schedule): [step, total] pairs of
    whole numbers, in step order; None when nothing is."""
    pairs = isinstance(refits, list) and all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int and v >= 0 for v in r) for r in refits)
    if pairs and [r[0] for r in refits] == sorted(r[0] for r in refits):
        return None
    return f"records refits {str(refits)[:60]}, expected [step, total] pairs of whole numbers in step order"


def second_pass_problem(state: dict) -> str | None:
    """What is wrong with a run's recorded first-pass losses and second-pass order (`data.second_pass`); None
    when nothing is."""
    losses, order = state.get("first_pass_losses", []), state.get("second_pass")
    if not (isinstance(losses, list) and all(finite_number(v) for v in losses)):
        return f"records first_pass_losses {str(losses)[:60]}, expected a list of finite numbers"
    if order is not None and not (isinstance(order, list) and all(type(v) is int for v in order)
                                  and sorted(order) == list(range(len(order)))):
        return f"records second_pass {str(order)[:60]}, expected an order of the training rows"
    return None


def read_checkpoint(ckpt: Path, *, model, backend: str, optimizer, scheduler) -> Loaded:
    """Verify checksums, then read and check every file against this run's model, optimizer and scheduler."""
    verify_files(ckpt)
    state = read_json(ckpt / STATE)
    if state.get("step") != step_of(ckpt):
        raise StateInvalid(f"{STATE} records step {state.get('step')!r}")
    if not finite_number(state.get("last_loss")):
        raise StateInvalid(f"{STATE} records a loss of {state.get('last_loss')!r}")
    if problem := refits_problem(state.get("refits", [])) or second_pass_problem(state):
        raise StateInvalid(f"{STATE} {problem}")
    weights = _read_weights(ckpt, model, backend)
    return Loaded(ckpt, state, weights, read_optimizer(ckpt / OPTIMIZER, optimizer),
                  read_scheduler(ckpt / SCHEDULER, scheduler), read_rng(ckpt / RNG))


def _read_weights(ckpt: Path, model, backend: str) -> dict:
    """The saved weights, with the names and shapes the model expects and finite values."""
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        if f.name not in (OPTIMIZER, RNG):
            try:
                sd.update(load_file(str(f)))
            except Exception as e:  # damaged bytes: safetensors raises several types
                raise StateInvalid(f"{f.name} is not readable ({type(e).__name__})") from None
    if backend == "full":
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        aliases: dict[int, set] = {}  # tied weights are saved once under one of their names
        for name, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), set()).add(name)
        missing = [sorted(names)[0] for names in aliases.values() if not names & set(sd)]
    else:
        from peft.utils import get_peft_model_state_dict

        expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
        missing = sorted(set(expected) - set(sd))
    wrong = sorted(k for k in sd if expected.get(k) != tuple(sd[k].shape))
    if missing or wrong:
        raise StateInvalid(f"weights do not match the model ({len(missing)} missing, {len(wrong)} unexpected or "
                           f"reshaped, e.g. {(missing or wrong)[0]})")
    if bad := first_nonfinite(sd):
        raise StateInvalid(f"weight {bad} holds NaN or inf")
    return sd


def newest_good(run_dir: Path, *, model, backend: str, optimizer, scheduler) -> tuple[Loaded | None, list[str]]:
    """The newest checkpoint that verifies and loads, and one line per newer one skipped (`checkpoints/step-N: why`)."""
    skipped = []
    for ckpt in reversed(_step_dirs(run_dir)):
        try:
            return read_checkpoint(ckpt, model=model, backend=backend, optimizer=optimizer,
                                   scheduler=scheduler), skipped
        except StateInvalid as e:
            skipped.append(f"checkpoints/{ckpt.name}: {e}")
    return None, skipped


def apply_checkpoint(loaded: Loaded, *, model, backend: str, optimizer, scheduler, rank: int = 0) -> dict:
    """Restore weights, optimizer, scheduler and this rank's RNG in place; return the saved state (step, cursor).

    The files hold full tensors; a sharded (FSDP) model and its optimizer keep only their shards of them.
    """
    from mens.train.fsdp import load_optimizer_state, loading_full_tensors

    with loading_full_tensors(model):
        if backend == "full":
            model.load_state_dict(loaded.weights, strict=False)
        else:
            from peft.utils import set_peft_model_state_dict

            set_peft_model_state_dict(model, loaded.weights)
    load_optimizer_state(optimizer, loaded.optimizer)
    scheduler.load_state_dict(loaded.scheduler)
    ranks = loaded.rng
    restore_rng(ranks[rank] if rank < len(ranks) else ranks[0])  # another world size: same data, new streams
    return loaded.state


def save_final_weights(model, run: Path, backend: str, weights: dict | None, *, step: int, loss: float) -> None:
    """The run's adapter (or full weights), checked finite, written into a temporary directory beside it, fsynced,
    and moved in file by file, config files last (a reader never sees a config without its weights).

    `weights`: full tensors gathered from an FSDP-sharded model (None = the model's own).
    """
    bad = nonfinite_weights(model) if weights is None else [k for k, t in weights.items() if first_nonfinite({k: t})]
    if bad or not math.isfinite(loss):
        raise not_finite_error(run, step, loss, bad, saving="the run's final weights")
    tmp = run / ".tmp-final-weights"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_weights(model, tmp, backend, state=weights)
        atomic.kill_point("final.written", step)
        atomic.publish_files(tmp, run, last=("adapter_config.json", "config.json"))
    except (OSError, _safetensors_error()) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{run}: writing the final weights failed ({_one_line(e)}); the checkpoints are "
                        "intact. Free disk space, then run again with --resume") from None


def nonfinite_weights(model) -> list[str]:
    """Names of trainable parameters holding NaN or inf (this process's shard of a sharded parameter)."""
    bad = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            local = p.to_local() if hasattr(p, "to_local") else p
            if not bool(local.detach().isfinite().all()):
                bad.append(name)
    return bad


def not_finite_error(run_dir: Path, step: int, loss: float, bad: list[str], saving: str = "a checkpoint") -> ModelError:
    """The error for a step that must not be saved; it names the newest checkpoint that was saved (all are finite)."""
    what = f"{len(bad)} trainable tensors hold NaN or inf (e.g. {bad[0]})" if bad else f"the loss is {loss}"
    good = [c for c in list_checkpoints(run_dir) if step_of(c) < step]
    where = (f"the last good checkpoint is {good[-1]}; lower --lr or check the data, then continue with --resume"
             if good else "no good checkpoint was saved before it; lower --lr or check the data and start again")
    return ModelError(f"step {step}: {what}, so it is not saved as {saving}; {where}")
