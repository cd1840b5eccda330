"""The fused LoRA MLP (mens.train.lora_mlp): peft's loss and gradients, less saved for backward, peft's modules
wherever it does not apply."""

from __future__ import annotations

import contextlib

import pytest
import torch
from tiny_archs import live_lora, loss_and_grads, tiny_model

from mens.train import flat_4bit, lora_mlp
from mens.train.kernels import bind_layer_kernels
from mens.train.lora_mlp import fuse_lora_mlps, is_fused

CPU_BF16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731


def _model(arch: str, dropout: float = 0.0, seed: int = 0):
    return live_lora(tiny_model(arch, seed=seed), dropout=dropout, seed=seed)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "qwen3_5"])
def test_fused_mlp_gives_peft_loss_and_gradients(arch):
    ref = _model(arch)
    fused = _model(arch)
    note = fuse_lora_mlps(fused, contextlib.nullcontext)
    assert note == "2 of 2 decoder layers (gated-MLP products recomputed in backward)"
    assert sum(is_fused(m) for m in fused.modules()) == 2
    loss0, grads0 = loss_and_grads(ref)
    loss1, grads1 = loss_and_grads(fused)
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert grads0.keys() == grads1.keys() and any("mlp.down_proj.lora_A" in n for n in grads0)
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, rtol=1e-4, atol=1e-6), name


def test_fused_mlp_under_bf16_autocast():
    ref, fused = _model("qwen2"), _model("qwen2")
    assert fuse_lora_mlps(fused, CPU_BF16)
    loss0, grads0 = loss_and_grads(ref, CPU_BF16)
    loss1, grads1 = loss_and_grads(fused, CPU_BF16)
    assert loss1 == pytest.approx(loss0, rel=1e-3)
    for name, g in grads0.items():
        assert grads1[name].dtype == torch.float32  # the f32 master adapters get f32 gradients
        assert torch.allclose(grads1[name], g, rtol=0.05, atol=0.02 * g.abs().max().item() + 1e-5), name


def _saved_bytes(model) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    ids = torch.randint(2, 300, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return total


def test_fused_mlp_saves_less_for_backward():
    """At least SiLU's output and the gated product (2 x tokens x MLP width per layer) are no longer kept."""
    ref, fused = _model("qwen2"), _model("qwen2")
    fuse_lora_mlps(fused, contextlib.nullcontext)
    tokens, width, layers = 2 * 64, 64, 2
    assert _saved_bytes(ref) - _saved_bytes(fused) >= 2 * tokens * width * 4 * layers


def test_disabled_adapters_and_unqualified_mlps_keep_peft():
    fused = _model("qwen2")
    fuse_lora_mlps(fused, contextlib.nullcontext)
    ids = torch.randint(2, 300, (1, 8), generator=torch.Generator().manual_seed(2))
    base = tiny_model("qwen2")
    with torch.no_grad(), fused.disable_adapter():
        assert torch.allclose(fused(input_ids=ids).logits, base(input_ids=ids).logits, atol=1e-6)
    assert fuse_lora_mlps(_model("qwen2", dropout=0.1), contextlib.nullcontext) is None  # dropout: peft's own
    assert fuse_lora_mlps(_model("gemma3_text"), contextlib.nullcontext) is None  # GELU-gated


def test_switch_off(monkeypatch):
    monkeypatch.setattr(lora_mlp, "FUSED_LORA_MLP", "off")
    assert fuse_lora_mlps(_model("qwen2"), contextlib.nullcontext) is None


def test_layer_kernels_leave_fused_mlps_alone():
    fused = _model("qwen2")
    fuse_lora_mlps(fused, contextlib.nullcontext)
    note = bind_layer_kernels(fused, rms_norm=lambda x, w, eps, *a: w * (x.float() * torch.rsqrt(
        x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), swiglu=lambda a, b: None,
        autocast=contextlib.nullcontext, source="reference")
    assert note == "reference: RMSNorm in 4 places"


@pytest.mark.parametrize("flat_absmax", ["off", "auto"])
def test_fused_mlp_over_4bit_base(tiny_model_dir, monkeypatch, flat_absmax):
    """QLoRA: the base projections are bitsandbytes NF4 layers; the input gradient dequantizes as bnb's does, also
    with FLAT_ABSMAX on (its absmax dequantized once per weight)."""
    from mens.model.load import load_base

    monkeypatch.setattr(flat_4bit, "FLAT_ABSMAX", flat_absmax)
    monkeypatch.setattr(flat_4bit, "_FLAT", flat_4bit.WeakIdKeyDictionary())

    def build():
        return live_lora(load_base(tiny_model_dir, backend="qlora", device="cpu"))

    ref, fused = build(), build()
    assert fuse_lora_mlps(fused, contextlib.nullcontext) == "2 of 2 decoder layers (gated-MLP products recomputed " \
                                                             "in backward)"
    loss0, grads0 = loss_and_grads(ref)
    loss1, grads1 = loss_and_grads(fused)
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, rtol=1e-3, atol=1e-5 * g.abs().max().item() + 1e-7), name
    assert (len(flat_4bit._FLAT) > 0) == (flat_absmax == "auto")  # the flat path ran exactly when switched on



@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["lora", "qlora"])
def test_fused_mlp_on_cuda(backend, tiny_model_dir):
    """On CUDA under bf16 autocast (Liger's SwiGLU kernels where installed): peft's loss and gradients."""
    from mens.model.load import load_base

    def build():
        return live_lora(load_base(tiny_model_dir, backend=backend, device="cuda"))

    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    ref, fused = build(), build()
    assert fuse_lora_mlps(fused, autocast)
    ids = torch.randint(2, 300, (2, 64), generator=torch.Generator().manual_seed(1)).cuda()
    out = []
    for model in (ref, fused):
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        out.append((loss.item(), {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}))
    (loss0, grads0), (loss1, grads1) = out
    assert loss1 == pytest.approx(loss0, rel=1e-2)
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, rtol=0.05, atol=0.03 * g.abs().max().item() + 1e-5), name
