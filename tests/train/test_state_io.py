"""Optimizer, scheduler and RNG state round-trip exactly through safetensors + JSON, and anything that does not fit
the live objects is refused with a one-line reason."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from mens.errors import ModelError
from mens.train.checkpoint import capture_rng, restore_rng
from mens.train.schedule import make_scheduler
from mens.train.state_io import (
    StateInvalid,
    optimizer_bytes,
    read_optimizer,
    read_rng,
    read_scheduler,
    rng_bytes,
    scheduler_bytes,
)


def _trained(steps: int = 3):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    sched = make_scheduler(opt, warmup=2, total=10)
    for _ in range(steps):
        loss = (params[0] ** 2).sum() + params[1].sin().sum()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return params, opt, sched


def test_optimizer_and_scheduler_round_trip_bit_identically(tmp_path):
    params, opt, sched = _trained()
    (tmp_path / "o.safetensors").write_bytes(optimizer_bytes(opt.state_dict()))
    (tmp_path / "s.json").write_bytes(scheduler_bytes(sched.state_dict()))

    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = torch.optim.AdamW(params2, lr=1e-2, weight_decay=0.1)
    sched2 = make_scheduler(opt2, warmup=2, total=10)
    opt2.load_state_dict(read_optimizer(tmp_path / "o.safetensors", opt2))
    sched2.load_state_dict(read_scheduler(tmp_path / "s.json", sched2))
    assert opt2.param_groups[0]["betas"] == (0.9, 0.999) and isinstance(opt2.param_groups[0]["betas"], tuple)
    for o, p in ((opt, params), (opt2, params2)):  # one more step on each: the same bits
        ((p[0] ** 2).sum() + p[1].sin().sum()).backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(params, params2, strict=True))
    assert sched.state_dict() == sched2.state_dict()


def test_optimizer_file_for_other_parameters_is_refused(tmp_path):
    _, opt, _ = _trained()
    (tmp_path / "o.safetensors").write_bytes(optimizer_bytes(opt.state_dict()))
    other = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(6))])
    with pytest.raises(StateInvalid, match="has shape \\(5,\\), the parameter \\(6,\\)"):
        read_optimizer(tmp_path / "o.safetensors", other)
    fewer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4, 3))])
    with pytest.raises(StateInvalid, match="parameter groups do not match"):
        read_optimizer(tmp_path / "o.safetensors", fewer)


def test_non_tensor_non_json_state_is_refused_at_save():
    with pytest.raises(ModelError, match="cannot be saved in a checkpoint \\(tensors and JSON only\\)"):
        optimizer_bytes({"state": {0: {"step": object()}}, "param_groups": []})


def test_scheduler_file_cannot_set_other_attributes(tmp_path):
    _, _, sched = _trained()
    sd = json.loads(scheduler_bytes(sched.state_dict()))
    sd["state"]["optimizer"] = "not an optimizer"  # LambdaLR.load_state_dict would set it as an attribute
    (tmp_path / "s.json").write_text(json.dumps(sd))
    with pytest.raises(StateInvalid, match="not a vox_mens_scheduler_v1 state"):
        read_scheduler(tmp_path / "s.json", sched)
    sd["state"].pop("optimizer")
    sd["state"]["last_epoch"] = "3"
    (tmp_path / "s.json").write_text(json.dumps(sd))
    with pytest.raises(StateInvalid, match="scheduler 'last_epoch'"):
        read_scheduler(tmp_path / "s.json", sched)


def test_rng_round_trip_restores_every_stream(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    np.random.normal()  # numpy keeps a cached gaussian: part of the state
    state = capture_rng()
    state["cuda"] = [torch.arange(16, dtype=torch.uint8)]  # the CUDA path, without a GPU
    expect = (torch.rand(3), random.random(), np.random.normal())
    (tmp_path / "r.safetensors").write_bytes(rng_bytes([state, state]))
    ranks = read_rng(tmp_path / "r.safetensors")
    assert len(ranks) == 2 and torch.equal(ranks[1]["cuda"][0], state["cuda"][0])
    restore_rng(ranks[0])
    assert torch.equal(torch.rand(3), expect[0]) and random.random() == expect[1]
    assert np.random.normal() == expect[2]


def test_rng_file_with_bad_python_state_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save

    (tmp_path / "r.safetensors").write_bytes(rng_bytes([capture_rng()]))
    with safe_open(str(tmp_path / "r.safetensors"), "pt") as f:
        meta, tensors = json.loads(f.metadata()["mens"]), {k: f.get_tensor(k) for k in f.keys()}
    meta["ranks"][0]["python"][1] = meta["ranks"][0]["python"][1][:10]  # a state vector of the wrong size
    (tmp_path / "r.safetensors").write_bytes(save(tensors, metadata={"mens": json.dumps(meta)}))
    with pytest.raises(StateInvalid, match="rank 0's RNG state is not valid"):
        read_rng(tmp_path / "r.safetensors")
