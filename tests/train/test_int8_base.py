"""Frozen base projections in int8 for LoRA on the f32 CPU path (mens.train.int8_base)."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from train_tiny import tiny_config

from mens.model.load import load_base
from mens.model.lora import attach_lora
from mens.train import int8_base
from mens.train.int8_base import Int8Linear
from mens.train.lora_mlp import fuse_lora_mlps
from mens.train.run import run_training


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("bias", [False, True])
def test_forward_and_input_gradient_follow_f32(bias):
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(96, 48, bias=bias).requires_grad_(False)
    x = torch.randn(2, 37, 96, generator=gen, requires_grad=True)
    dy = torch.randn(2, 37, 48, generator=gen)
    (want,) = torch.autograd.grad(linear(x), x, dy)
    y_ref = linear(x).detach()
    q = Int8Linear(linear)
    y = q(x)
    (got,) = torch.autograd.grad(y, x, dy)
    assert y.shape == y_ref.shape and y.dtype == torch.float32
    assert _rel(y.detach(), y_ref) < 0.03 and _rel(got, want) < 0.03
    assert 0 < _rel(y.detach(), y_ref)  # it really is int8 arithmetic, not the f32 weight
    assert q.w8.dtype == torch.int8 and int(q.w8.abs().max()) <= int8_base.WEIGHT_LEVELS
    assert not list(q.parameters())  # nothing of it trains or reaches an optimizer


def test_smoothing_keeps_rows_with_an_outlier_channel():
    """One channel 50x the rest flattens a row's int8 levels; calibrated smoothing moves it into the weight."""
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 32, bias=False).requires_grad_(False)
    x = torch.randn(200, 64, generator=gen)
    x[:, 5] *= 50.0
    ref = linear(x)
    plain = _rel(Int8Linear(linear)(x), ref)
    smoothed = _rel(Int8Linear(linear, x.abs().amax(dim=0))(x), ref)
    assert smoothed < plain / 2


def _lora(model_dir):
    torch.manual_seed(0)
    model = attach_lora(load_base(model_dir, backend="lora", device="cpu"), r=4, alpha=8, dropout=0.0)
    for name, p in model.named_parameters():  # B starts at zero: give the adapters something to say
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return model


def test_bind_swaps_hidden_width_projections_and_restore_is_exact(tiny_model_dir):
    model = _lora(tiny_model_dir)
    ids = torch.arange(1, 25).reshape(2, 12)
    with torch.no_grad():
        before = model(input_ids=ids).logits
    hidden = model.config.hidden_size
    swapped, kept = int8_base.bind(model, lambda: model(input_ids=ids), width=hidden)
    names = {m: n for n, m in model.named_modules()}
    assert swapped and kept == 2  # one down projection per layer, two layers
    assert all(type(m.base_layer) is Int8Linear and m.base_layer.in_features == hidden for m, _ in swapped)
    assert not any(names[m].endswith("down_proj") for m, _ in swapped)
    assert all(float(m.base_layer.inv_smooth.std()) > 0 for m, _ in swapped)  # calibrated, not all ones
    with torch.no_grad():
        during = model(input_ids=ids).logits
    assert 0 < _rel(during, before) < 0.1  # int8 arithmetic on 64 features; a wrong scale would be ~100%
    int8_base.restore(swapped)
    assert all(type(m.base_layer) is torch.nn.Linear for m, _ in swapped)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)


def _lora_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return float(out.loss), torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def test_lora_gradients_through_int8_follow_f32_with_the_fused_mlp(tiny_model_dir):
    model = _lora(tiny_model_dir)
    ids = torch.arange(1, 49).reshape(4, 12)
    loss32, g32 = _lora_grads(model, ids)
    swapped, _ = int8_base.bind(model, lambda: model(input_ids=ids), width=model.config.hidden_size)
    loss_peft, g_peft = _lora_grads(model, ids)
    assert fuse_lora_mlps(model, contextlib.nullcontext)
    loss_fused, g_fused = _lora_grads(model, ids)
    assert loss_peft == pytest.approx(loss32, rel=0.05)
    assert float(torch.nn.functional.cosine_similarity(g_peft, g32, dim=0)) > 0.95
    # the fused MLP computes gate and up's input gradient with the same int8 function as their own backward
    assert loss_fused == pytest.approx(loss_peft, rel=1e-5)
    assert _rel(g_fused, g_peft) < 1e-4
    int8_base.restore(swapped)


@pytest.mark.parametrize("why", ["off", "bf16", "cuda", "qlora", "sharded", "arm"])
def test_bound_only_for_lora_in_f32_on_one_x86_cpu_process(tiny_model_dir, why, monkeypatch):
    model = _lora(tiny_model_dir)
    monkeypatch.setattr(int8_base.platform, "machine", lambda: "aarch64" if why == "arm" else "x86_64")
    kw = dict(setting="auto", device="cpu", amp=None, backend="lora", sharded=False, calibrate=None)
    kw.update({"off": {"setting": "off"}, "bf16": {"amp": "bf16"}, "cuda": {"device": "cuda"},
               "qlora": {"backend": "qlora"}, "sharded": {"sharded": True}, "arm": {}}[why])
    assert int8_base.bind_for_training(model, **kw) == ([], None)
    assert not any(type(m) is Int8Linear for m in model.modules())


def test_a_run_with_int8_base_records_it_and_saves_an_f32_adapter(data_dir, tmp_path, tiny_qwen_dir, monkeypatch):
    """Qwen2's q/k/v carry a bias; the run trains, says what it bound, and what it saves loads into plain peft."""
    monkeypatch.setattr(int8_base, "int8_speedup", lambda width: 1.5)  # whatever this CPU's int8 kernels are
    out = tmp_path / "run"
    summary = run_training(tiny_config(data_dir, out, tiny_qwen_dir, save_every=0, max_steps=3, int8_base="auto"))
    assert summary["steps"] == 3 and summary["final_loss"] == summary["final_loss"]  # finite, not NaN
    checks = {c["check"]: c["detail"] for c in json.loads((out / "training-preflight.json").read_text())["checks"]}
    assert "frozen base projections in int8" in checks["int8 base"] and "down projection" in checks["int8 base"]
    man = json.loads((out / "training_manifest.json").read_text())
    assert man["matmul_dtype"] == "f32, int8 frozen base" and man["config"]["int8_base"] == "auto"
    from mens.model.lora import load_adapter

    tuned = load_adapter(load_base(tiny_qwen_dir, backend="lora", device="cpu"), out)
    assert not any(type(m) is Int8Linear for m in tuned.modules())


def test_a_model_whose_loss_int8_moves_keeps_its_f32_base(tiny_model_dir, monkeypatch):
    """The sample rows' loss in int8 must stay within MAX_LOSS_SHIFT of f32, or every projection goes back."""
    model = _lora(tiny_model_dir)
    ids = torch.arange(1, 25).reshape(2, 12)

    def sample_loss():
        with torch.no_grad():
            return float(model(input_ids=ids, labels=ids).loss)

    kw = dict(setting="auto", device="cpu", amp=None, backend="lora", sharded=False, calibrate=sample_loss)
    monkeypatch.setattr(int8_base, "int8_speedup", lambda width: 1.5)
    swapped, note = int8_base.bind_for_training(model, **kw)
    assert swapped and "in int8" in note and "loss on sample rows" in note
    int8_base.restore(swapped)
    monkeypatch.setattr(int8_base, "MAX_LOSS_SHIFT", 1e-9)  # no int8 loss is that close to f32
    swapped, note = int8_base.bind_for_training(model, **kw)
    assert swapped == [] and note.startswith("kept in f32") and "model.int8_base: off" in note
    assert not any(type(m) is Int8Linear for m in model.modules())


def test_a_cpu_whose_int8_matmul_is_not_faster_keeps_the_f32_base(tiny_model_dir, monkeypatch):
    """x86 alone does not promise fast int8 kernels (a real AVX2-only Zen 3 ran torch._int_mm at 0.03x f32): the
    projection is timed first, and a slow one keeps every projection f32 with a note that says why."""
    model = _lora(tiny_model_dir)
    monkeypatch.setattr(int8_base.platform, "machine", lambda: "x86_64")
    seen = []
    monkeypatch.setattr(int8_base, "int8_speedup", lambda width: seen.append(width) or 0.03)
    kw = dict(setting="auto", device="cpu", amp=None, backend="lora", sharded=False,
              calibrate=lambda: pytest.fail("a slow CPU must not be calibrated"))
    swapped, note = int8_base.bind_for_training(model, **kw)
    assert swapped == [] and seen == [model.config.hidden_size]
    assert note.startswith("kept in f32") and "0.03x" in note and f"{int8_base.MIN_SPEEDUP}x" in note
    assert not any(type(m) is Int8Linear for m in model.modules())


def test_the_speed_check_times_a_real_projection_in_both_precisions():
    """A real reading on this CPU: positive and finite (which side wins depends on the CPU's kernels)."""
    speedup = int8_base.int8_speedup(64, rows=32, repeats=1)
    assert 0.0 < speedup < float("inf")
