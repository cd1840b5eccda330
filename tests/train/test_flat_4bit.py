"""FLAT_ABSMAX (mens.train.flat_4bit): bitsandbytes' own 4-bit weights, loss and gradients, from an absmax
dequantized once per weight; bitsandbytes' own paths when off and outside training."""

from __future__ import annotations

import types

import pytest
import torch
from tiny_archs import live_lora

from mens.train import flat_4bit
from mens.train.flat_4bit import dequantized_4bit, flatten_4bit_bases
from mens.train.lora_mlp import _base

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture
def flat(monkeypatch):
    monkeypatch.setattr(flat_4bit, "FLAT_ABSMAX", "auto")
    monkeypatch.setattr(flat_4bit, "_FLAT", flat_4bit.WeakIdKeyDictionary())
    return flat_4bit


def _linear4bit(out_f=64, in_f=128, bias=False):
    lin = bnb.nn.Linear4bit(in_f, out_f, bias=bias, compute_dtype=torch.float32, quant_type="nf4",
                            compress_statistics=True)
    lin.weight = bnb.nn.Params4bit(torch.randn(out_f, in_f) * 0.05, requires_grad=False, quant_type="nf4",
                                   compress_statistics=True)._quantize("cpu")
    return lin


def test_dequantizes_as_bitsandbytes(flat):
    """The weight bitsandbytes' own dequantize_4bit gives, bit for bit, in its dtype or another, from an absmax
    dequantized once and kept while the weight is unchanged; a re-quantized weight is dequantized afresh."""
    import bitsandbytes.functional as bnbf

    lin = _linear4bit()
    assert lin.weight.quant_state.nested
    want = bnbf.dequantize_4bit(lin.weight.data.view(-1, 1), lin.weight.quant_state)
    first = dequantized_4bit(lin.weight)
    kept = flat._FLAT[lin.weight][1]
    assert torch.equal(first, want) and torch.equal(dequantized_4bit(lin.weight), want)
    assert torch.equal(dequantized_4bit(lin.weight, torch.bfloat16), want.to(torch.bfloat16))
    assert flat._FLAT[lin.weight][1] is kept  # dequantized once
    lin.weight = _linear4bit().weight
    assert torch.equal(dequantized_4bit(lin.weight),
                       bnbf.dequantize_4bit(lin.weight.data.view(-1, 1), lin.weight.quant_state))
    x = torch.randn(3, 128)
    with torch.no_grad():
        assert torch.allclose(_base(types.SimpleNamespace(base_layer=lin), x), lin(x), atol=1e-6)


def test_frozen_linear_gives_bitsandbytes_output_and_input_grad(flat):
    """One projection with a bias: the same output and input gradient as bitsandbytes' own forward and backward."""
    lin = _linear4bit(bias=True)
    x = torch.randn(2, 5, 128)
    lin(x[:1, :1])  # bitsandbytes sets its compute dtype on the first call
    x0, x1 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y0 = lin(x0)
    assert flatten_4bit_bases(torch.nn.ModuleList([lin])) is not None
    y1 = lin(x1)
    assert len(flat._FLAT) == 1  # the flat path ran
    dy = torch.randn_like(y0)
    y0.backward(dy)
    y1.backward(dy)
    assert torch.allclose(y1, y0, rtol=1e-6, atol=1e-6) and torch.allclose(x1.grad, x0.grad, rtol=1e-6, atol=1e-6)


def test_flat_bases_give_bitsandbytes_loss_and_gradients(tiny_qwen_dir, flat):
    """QLoRA of a tiny Qwen2 (attention projections with biases): every 4-bit projection bound, the same loss and
    LoRA gradients as bitsandbytes' own path; generation (eval mode) keeps bitsandbytes' paths."""
    from mens.model.load import load_base

    def build():
        return live_lora(load_base(tiny_qwen_dir, backend="qlora", device="cpu")).train()

    def loss_and_grads(model):
        ids = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(1))
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    ref, flat_model = build(), build()
    loss_and_grads(flat_model)  # bitsandbytes sets each layer's compute dtype on its first call
    n4 = sum(isinstance(m, bnb.nn.Linear4bit) for m in flat_model.modules())
    assert n4 == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert flatten_4bit_bases(flat_model) == f"{n4} 4-bit projections dequantize from an absmax kept in f32"
    loss0, grads0 = loss_and_grads(ref)
    loss1, grads1 = loss_and_grads(flat_model)
    assert len(flat._FLAT) == n4  # every projection took the flat path
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert any("self_attn.q_proj.lora_A" in n for n in grads0)
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, rtol=1e-5, atol=1e-7), name
    flat._FLAT.clear()
    with torch.no_grad():
        flat_model.eval()(input_ids=torch.tensor([[3, 4, 5]]))
    assert len(flat._FLAT) == 0  # outside training: bitsandbytes' own paths


def test_off_binds_nothing(monkeypatch):
    monkeypatch.setattr(flat_4bit, "FLAT_ABSMAX", "off")
    layer = _linear4bit()
    assert flatten_4bit_bases(torch.nn.ModuleList([layer])) is None
    assert "forward" not in vars(layer)
