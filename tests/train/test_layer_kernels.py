"""Liger's RMSNorm/SwiGLU bound to a model's decoder layers (mens.train.kernels): the binding on CPU with torch
reference functions in Liger's signatures, Liger's own kernels against torch's on CUDA."""

from __future__ import annotations

import contextlib

import pytest
import torch
from tiny_archs import tiny_model

from mens.model.lora import attach_lora
from mens.train import kernels
from mens.train.kernels import bind_layer_kernels, layer_kernels


class Reference:
    """torch versions of liger_rms_norm / liger_swiglu (llama casting), counting their calls."""

    def __init__(self):
        self.calls = {"rms_norm": 0, "swiglu": 0}

    def rms_norm(self, x, weight, eps, offset, casting_mode, in_place):
        assert (offset, casting_mode, in_place) == (0.0, "llama", False)
        self.calls["rms_norm"] += 1
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def swiglu(self, gate, up):
        self.calls["swiglu"] += 1
        return torch.nn.functional.silu(gate) * up


def _bind(model, ref):
    return bind_layer_kernels(model, rms_norm=ref.rms_norm, swiglu=ref.swiglu, autocast=contextlib.nullcontext,
                              source="reference")


@pytest.mark.parametrize("arch,norms,mlps", [("llama", 4, 2), ("qwen2", 4, 2), ("mistral", 4, 2),
                                             ("qwen3", 8, 2)])  # qwen3: q_norm and k_norm too
def test_bound_layers_give_the_same_logits(arch, norms, mlps):
    model = attach_lora(tiny_model(arch), r=4, alpha=8, dropout=0.0)
    for module in model.modules():  # non-zero adapters, so the MLP's adapted projections count
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.1)
    ids = torch.randint(2, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    ref = Reference()
    note = _bind(model, ref)
    assert note == f"reference: RMSNorm in {norms} places, SwiGLU MLP in {mlps} places"
    ref.calls = {"rms_norm": 0, "swiglu": 0}
    with torch.no_grad():
        got = model(input_ids=ids).logits
    assert ref.calls == {"rms_norm": norms, "swiglu": mlps}  # the bound functions are what runs
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_other_forms_keep_torchs_modules():
    """Gemma's norm scales by (1 + weight) and its MLP is GELU-gated: the probe tells, and nothing is bound."""
    model = tiny_model("gemma3_text")
    with torch.no_grad():  # a non-trivial weight, so (1 + w) and w differ everywhere
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.normal_(0.0, 0.5)
    ref = Reference()
    note = _bind(model, ref)
    assert note.startswith("reference: nothing bound; torch's kept for ")
    assert "Gemma3RMSNorm" in note and "Gemma3MLP" in note


def test_hybrid_binds_its_mlps_and_keeps_its_norms():
    model = tiny_model("qwen3_5")
    note = _bind(model, Reference())
    assert note.startswith("reference: SwiGLU MLP in 2 places; torch's kept for ")
    assert "Qwen3_5RMSNorm" in note


def test_layer_kernels_only_on_cuda(monkeypatch):
    model = tiny_model("qwen2")
    assert layer_kernels(model, "cpu", contextlib.nullcontext) is None
    monkeypatch.setattr(kernels, "LAYER_KERNELS", "off")
    assert layer_kernels(model, "cuda", contextlib.nullcontext) is None


@pytest.mark.gpu
@pytest.mark.parametrize("f32_norms", [False, True])  # True: QLoRA's layout, bf16 states through f32 norm weights
def test_liger_kernels_match_torch_on_cuda(f32_norms):
    """Liger's kernels on a bf16 LoRA model: the loss and the adapter gradients agree with torch's modules."""
    pytest.importorskip("liger_kernel")

    def loss_and_grads(bind: bool):
        base = tiny_model("qwen2", vocab=300).to("cuda", torch.bfloat16)
        for module in base.modules():
            if f32_norms and type(module).__name__.endswith("RMSNorm"):
                module.float()
        model = attach_lora(base, r=4, alpha=8, dropout=0.0)
        for module in model.modules():
            if hasattr(module, "lora_B"):
                torch.nn.init.normal_(module.lora_B["default"].weight, std=0.1, generator=None)
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
        note = layer_kernels(model, "cuda", autocast) if bind else None
        ids = torch.randint(2, 300, (2, 64), generator=torch.Generator().manual_seed(0)).cuda()
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}
        return note, loss.item(), grads

    torch.manual_seed(0)
    _, loss0, grads0 = loss_and_grads(False)
    torch.manual_seed(0)
    note, loss1, grads1 = loss_and_grads(True)
    assert note == "Liger: RMSNorm in 4 places, SwiGLU MLP in 2 places"
    assert abs(loss1 - loss0) <= 2e-2 * abs(loss0)
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, atol=2e-2 * g.abs().max().item() + 1e-4), name
