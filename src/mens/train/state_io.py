"""Optimizer, scheduler and RNG state as tensors (safetensors) and JSON: what a checkpoint holds instead of pickles.

Reading never executes anything: safetensors parses a JSON header and raw tensor bytes, and every structure read
is checked against the live optimizer / scheduler (or a throwaway generator) before it is used. A file that does
not fit raises `StateInvalid` with a one-line reason.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from mens.errors import ModelError
from mens.run_records import OPTIMIZER_FORMAT, RNG_FORMAT, SCHEDULER_FORMAT, current_format

META_KEY = "mens"  # safetensors metadata entry holding the JSON part


class StateInvalid(Exception):
    """A checkpoint file is unreadable or does not fit this run; the message is one line: the file and why."""


def _json_value(value, where: str):
    """`value` as plain JSON data (tuples become lists); anything else is refused, never pickled."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v, where) for k, v in value.items()}
    raise ModelError(f"{where}: a {type(value).__name__} cannot be saved in a checkpoint (tensors and JSON only); "
                     "use an optimizer/scheduler whose state holds tensors and numbers")


def _pack(tensors: dict, meta: dict) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata={"format": "pt", META_KEY: json.dumps(meta)})


def _unpack(path: Path, fmt: str) -> tuple[dict, dict]:
    """Tensors and the JSON part of a safetensors file written by `_pack`."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {}).get(META_KEY, "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # damaged bytes: safetensors and json raise several types; all mean "unreadable"
        raise StateInvalid(f"{path.name} is not readable ({type(e).__name__})") from None
    if not isinstance(meta, dict) or current_format(meta.get("format")) != fmt:
        raise StateInvalid(f"{path.name} has no {fmt} description in its header")
    return tensors, meta


def optimizer_bytes(sd: dict) -> bytes:
    """`optimizer.state_dict()` as safetensors: state tensors under `state.<param>.<key>`, the rest as JSON."""
    import torch

    tensors, layout = {}, {}
    for i, s in sd["state"].items():
        entry = {}
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                name = f"state.{i}.{k}"
                tensors[name] = v.detach().cpu().contiguous()
                entry[k] = {"tensor": name}
            else:
                entry[k] = {"value": _json_value(v, f"optimizer state[{i}][{k!r}]")}
        layout[str(i)] = entry
    groups = _json_value(sd["param_groups"], "optimizer param_groups")
    return _pack(tensors, {"format": OPTIMIZER_FORMAT, "param_groups": groups, "state": layout})


def read_optimizer(path: Path, optimizer) -> dict:
    """The state dict saved by `optimizer_bytes`, checked against `optimizer` (groups, parameters, shapes)."""
    tensors, meta = _unpack(path, OPTIMIZER_FORMAT)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    live = optimizer.state_dict()["param_groups"]
    groups, layout = meta.get("param_groups"), meta.get("state")
    if not isinstance(groups, list) or len(groups) != len(live) or not isinstance(layout, dict):
        raise StateInvalid(f"{path.name}: {len(groups) if isinstance(groups, list) else '?'} parameter groups, "
                           f"this run has {len(live)}")
    for saved, now in zip(groups, live, strict=True):
        if not isinstance(saved, dict) or saved.get("params") != now["params"]:
            raise StateInvalid(f"{path.name}: its parameter groups do not match this run's trainable parameters")
        for k, v in now.items():  # JSON has no tuples; give back the types the optimizer uses (betas)
            if isinstance(v, tuple) and isinstance(saved.get(k), list):
                saved[k] = tuple(saved[k])
    state = {}
    for key, entry in layout.items():
        if not key.isdigit() or int(key) >= len(params) or not isinstance(entry, dict):
            raise StateInvalid(f"{path.name}: state for parameter {key!r}, this run has {len(params)}")
        state[int(key)] = {k: _state_value(path, tensors, ref, params[int(key)]) for k, ref in entry.items()}
    if tensors:
        raise StateInvalid(f"{path.name}: {len(tensors)} tensors no state entry names (e.g. {next(iter(tensors))})")
    return {"state": state, "param_groups": groups}


def _state_value(path: Path, tensors: dict, ref, param):
    if not isinstance(ref, dict) or len(ref) != 1 or not ({"tensor", "value"} & set(ref)):
        raise StateInvalid(f"{path.name}: malformed state entry {str(ref)[:60]}")
    if "value" in ref:
        return ref["value"]
    t = tensors.pop(ref["tensor"], None)
    if t is None:
        raise StateInvalid(f"{path.name}: tensor {ref['tensor']!r} is missing")
    if t.ndim and tuple(t.shape) != tuple(param.shape):
        raise StateInvalid(f"{path.name}: {ref['tensor']} has shape {tuple(t.shape)}, the parameter "
                           f"{tuple(param.shape)}")
    if t.is_floating_point() and not bool(t.isfinite().all()):
        raise StateInvalid(f"{path.name}: {ref['tensor']} holds NaN or inf")
    return t


def scheduler_bytes(sd: dict) -> bytes:
    return json.dumps({"format": SCHEDULER_FORMAT, "state": _json_value(sd, "scheduler state")}, indent=1).encode()


def read_scheduler(path: Path, scheduler) -> dict:
    """The scheduler state, with the same keys and value types as `scheduler.state_dict()` (it sets attributes)."""
    data = read_json(path)
    sd, live = data.get("state"), scheduler.state_dict()
    if current_format(data.get("format")) != SCHEDULER_FORMAT or not isinstance(sd, dict) or set(sd) != set(live):
        raise StateInvalid(f"{path.name}: not a {SCHEDULER_FORMAT} state with keys {sorted(live)}")
    for k, v in live.items():
        ok = type(sd[k]) is type(v) or (isinstance(v, float) and type(sd[k]) is int)
        if isinstance(v, list | tuple):
            ok = isinstance(sd[k], list) and len(sd[k]) == len(v) and all(
                type(a) is type(b) or {type(a), type(b)} <= {int, float} for a, b in zip(sd[k], v, strict=True))
        if k == "lr_lambdas":  # restored into the lambdas' __dict__: only what this run's lambdas hold
            ok = sd[k] == _json_value(v, "scheduler lr_lambdas")
        if not ok:
            raise StateInvalid(f"{path.name}: scheduler {k!r} is {str(sd[k])[:40]}, expected a value like {v!r}")
        if isinstance(v, tuple):
            sd[k] = tuple(sd[k])
    return sd


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise StateInvalid(f"{path.name} is not readable JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise StateInvalid(f"{path.name} is not a JSON object")
    return data


def rng_bytes(ranks: list[dict]) -> bytes:
    """Every rank's RNG streams: torch/CUDA states as uint8 tensors, python's and numpy's as JSON numbers."""
    tensors, meta = {}, []
    for r, st in enumerate(ranks):
        tensors[f"rank{r}.torch"] = st["torch"].clone()  # copies: safetensors refuses tensors that share memory
        for j, c in enumerate(st.get("cuda", [])):
            tensors[f"rank{r}.cuda{j}"] = c.cpu().clone()
        version, internal, gauss = st["python"]
        kind, keys, pos, has_gauss, cached = st["numpy"]
        meta.append({"python": [version, list(internal), gauss], "cuda": len(st.get("cuda", [])),
                     "numpy": {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos),
                               "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}})
    return _pack(tensors, {"format": RNG_FORMAT, "ranks": meta})


def read_rng(path: Path) -> list[dict]:
    """The per-rank RNG states of `rng_bytes`, each proven settable on a throwaway generator first."""
    import numpy as np
    import torch

    tensors, meta = _unpack(path, RNG_FORMAT)
    ranks = meta.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise StateInvalid(f"{path.name}: no per-rank RNG state")
    out = []
    for r, m in enumerate(ranks):
        try:
            t = tensors[f"rank{r}.torch"]
            cuda = [tensors[f"rank{r}.cuda{j}"] for j in range(int(m["cuda"]))]
            version, internal, gauss = m["python"]
            py = (int(version), tuple(int(x) for x in internal), None if gauss is None else float(gauss))
            n = m["numpy"]
            np_state = (str(n["kind"]), np.array(n["keys"], dtype=np.uint32), int(n["pos"]), int(n["has_gauss"]),
                        float(n["cached_gaussian"]))
            if t.dtype != torch.uint8 or any(c.dtype != torch.uint8 for c in cuda):
                raise ValueError("RNG states must be uint8 tensors")
            torch.Generator().set_state(t)
            random.Random().setstate(py)
            np.random.RandomState().set_state(np_state)
        except (KeyError, TypeError, ValueError, OverflowError, RuntimeError) as e:
            raise StateInvalid(f"{path.name}: rank {r}'s RNG state is not valid ({type(e).__name__})") from None
        out.append({"torch": t, "python": py, "numpy": np_state, **({"cuda": cuda} if cuda else {})})
    return out


def first_nonfinite(tensors: dict) -> str | None:
    """The name of the first floating tensor holding NaN or inf, or None."""
    for k, t in tensors.items():
        if t.is_floating_point() and not bool(t.isfinite().all()):
            return k
    return None


def finite_number(x) -> bool:
    """A JSON number that is not NaN or inf (a bool is not a number here)."""
    if isinstance(x, bool):
        return False
    return isinstance(x, int | float) and math.isfinite(x)
