"""Frozen LoRA base projections held in bf16 under CPU bf16 autocast (mens.train.bf16_base)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_archs import live_lora, loss_and_grads, tiny_model
from train_tiny import tiny_config

from mens.train import bf16_base
from mens.train import run as run_mod
from mens.train.lora_mlp import fuse_lora_mlps
from mens.train.run import run_training
from mens.train.telemetry import read_events

CPU_BF16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_same_loss_and_gradients_to_the_bit_and_restore_is_exact(arch, fused):
    """bf16 weights are the copies autocast makes on every call: the step must not change by one bit."""
    model = live_lora(tiny_model(arch))
    if fused:
        assert fuse_lora_mlps(model, CPU_BF16)
    loss0, grads0 = loss_and_grads(model, CPU_BF16)
    f32 = {n: p for n, p in model.named_parameters()}
    swapped = bf16_base.bind(model)
    assert len(swapped) == 2 * 7  # q, k, v, o, gate, up, down in each of two layers
    assert all(base.weight.dtype == torch.bfloat16 and not base.weight.requires_grad for base, _ in swapped)
    loss1, grads1 = loss_and_grads(model, CPU_BF16)
    assert loss1 == loss0
    assert grads1.keys() == grads0.keys()
    for name, g in grads0.items():
        assert grads1[name].dtype == torch.float32 and torch.equal(grads1[name], g), name
    bf16_base.restore(swapped)
    assert all(p is f32[n] for n, p in model.named_parameters())  # the very f32 tensors, not re-made copies


def test_only_frozen_adapted_projections_change():
    """Embeddings, the head tied to them, norms and the adapters keep their dtype."""
    model = live_lora(tiny_model("llama"))
    before = {n: p.dtype for n, p in model.named_parameters()}
    swapped = bf16_base.bind(model)
    changed = {n for n, p in model.named_parameters() if p.dtype != before[n]}
    assert changed and all(n.endswith("base_layer.weight") for n in changed)
    assert len(changed) == len(swapped)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert model.get_output_embeddings().weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n or "norm" in n)


@pytest.mark.parametrize("why", ["off", "f32", "cuda", "qlora", "full", "sharded"])
def test_bound_only_for_lora_under_bf16_autocast_on_one_cpu_process(why, monkeypatch):
    model = live_lora(tiny_model("llama"))
    if why == "off":
        monkeypatch.setattr(bf16_base, "BF16_BASE", "off")
    kw = dict(amp="bf16", device="cpu", backend="lora", sharded=False)
    kw.update({"off": {}, "f32": {"amp": None}, "cuda": {"device": "cuda"}, "qlora": {"backend": "qlora"},
               "full": {"backend": "full"}, "sharded": {"sharded": True}}[why])
    assert bf16_base.bind_for_training(model, **kw) == ([], None)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def _run(data_dir, out, model_dir, monkeypatch, setting: str):
    monkeypatch.setattr(run_mod, "cpu_has_native_bf16", lambda: True)  # bf16 autocast on any CPU
    monkeypatch.setattr(bf16_base, "BF16_BASE", setting)
    summary = run_training(tiny_config(data_dir, out, model_dir, save_every=0, eval_every=0, max_steps=3,
                                       autocast="bf16"))
    checks = {c["check"]: c["detail"] for c in json.loads((out / "training-preflight.json").read_text())["checks"]}
    losses = [e["loss"] for e in read_events(out) if e.get("event") == "step"]
    return summary, checks, losses, load_file(str(out / "adapter_model.safetensors"))


def test_a_run_trains_the_same_steps_and_saves_the_same_adapter(data_dir, tmp_path, tiny_qwen_dir, monkeypatch):
    """Qwen2's q/k/v carry a bias (left f32: autocast casts it as before)."""
    held = _run(data_dir, tmp_path / "bf16", tiny_qwen_dir, monkeypatch, "auto")
    cast = _run(data_dir, tmp_path / "cast", tiny_qwen_dir, monkeypatch, "off")
    assert "14 frozen base projections held in bf16" in held[1]["bf16 base"]
    assert "bf16 base" not in cast[1]
    assert held[0]["steps"] == cast[0]["steps"] == 3
    assert held[2] == cast[2] and len(held[2]) == 3  # every step's loss, to the bit
    assert held[3].keys() == cast[3].keys()
    assert all(torch.equal(held[3][k], cast[3][k]) for k in held[3])  # the saved adapter, to the bit


def test_copies_that_do_not_fit_the_memory_left_are_not_made():
    model = live_lora(tiny_model("llama"))
    kw = dict(amp="bf16", device="cpu", backend="lora", sharded=False)
    swapped, note = bf16_base.bind_for_training(model, spare_gb=1e-6, **kw)
    assert swapped == [] and note.startswith("kept f32: the bf16 copies of 14 frozen base projections")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    swapped, note = bf16_base.bind_for_training(model, spare_gb=1.0, **kw)
    assert len(swapped) == 14 and "held in bf16" in note
    bf16_base.restore(swapped)
