"""Per-example attention over packed rows (mens.train.segment_attention): the block mask's loss and gradients,
sliding windows inside an example, the model's own attention kept wherever it does not apply."""

from __future__ import annotations

import contextlib
import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from tiny_archs import tiny_model

from mens.model.lora import attach_lora
from mens.train import segment_attention
from mens.train.packing import batch_loss_sum, collate, collate_shared, model_inputs, shared_prefix
from mens.train.segment_attention import (
    NAME,
    bind_segment_attention,
    restore_attention,
    segment_attention_forward,
    shares_prefix,
    uses_segment_attention,
)
from mens.train.text import IGNORE, Example

NULL = contextlib.nullcontext
needs_varlen = pytest.mark.skipif(importlib.util.find_spec("torch.nn.attention.varlen") is None,
                                  reason=f"torch {torch.__version__} has no torch.nn.attention.varlen (torch >= 2.10)")


def _rows(seed: int = 1, lengths=((5, 11, 4), (13, 9))) -> list[list[Example]]:
    """Packed rows of examples whose second half is supervised (the second row is shorter: padding)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for row in lengths:
        exs = []
        for n in row:
            ids = torch.randint(3, 300, (n,), generator=g).tolist()
            exs.append(Example(ids=ids, labels=[IGNORE] * (n // 2) + ids[n // 2:]))
        rows.append(exs)
    return rows


def _model(arch: str, lora: bool = True):
    model = tiny_model(arch, seed=0)
    if lora:
        torch.manual_seed(0)
        model = attach_lora(model, r=4, alpha=8, dropout=0.0)
        gen = torch.Generator().manual_seed(0)
        for module in model.modules():  # non-zero B: every adapter shows in the output and the gradients
            if hasattr(module, "lora_B"):
                with torch.no_grad():
                    module.lora_B["default"].weight.normal_(0.0, 0.1, generator=gen)
    return model


def _assert_same_training_in_half_precision(ref, other, rows, device, autocast):
    """One backward of `rows` through each model: the same loss within 2% and gradients within 5% of their scale
    (bf16 rounding apart)."""
    losses, grads = [], []
    for model in (ref, other):
        model.zero_grad(set_to_none=True)
        loss, _ = batch_loss_sum(model, rows, 0, device, autocast)
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad.float() for k, p in model.named_parameters() if p.requires_grad})
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
    for k, g in grads[0].items():
        assert (grads[1][k] - g).abs().max() <= 0.05 * g.abs().max() + 1e-6, k


def _loss_and_grads(model, rows):
    model.zero_grad(set_to_none=True)
    loss, n = batch_loss_sum(model, rows, 0, "cpu", NULL)
    loss.backward()
    return loss.item(), n, {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"])
def test_per_example_attention_gives_the_block_masks_loss_and_gradients(arch):
    rows = _rows()
    ref, seg = _model(arch), _model(arch)
    assert ref.config._attn_implementation == "sdpa"
    own, note = bind_segment_attention(seg, "cpu", NULL, 300)
    assert own == "sdpa" and "one example at a time" in note and uses_segment_attention(seg)
    loss0, n0, grads0 = _loss_and_grads(ref, rows)
    loss1, n1, grads1 = _loss_and_grads(seg, rows)
    assert n1 == n0 and loss1 == pytest.approx(loss0, rel=1e-5)
    assert grads0.keys() == grads1.keys() and any("self_attn" in k and "lora_A" in k for k in grads0)
    for k, g in grads0.items():
        assert (grads1[k] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-7, k


def test_the_packed_batch_reaches_the_function_flattened_with_boundaries():
    model = _model("llama")
    bind_segment_attention(model, "cpu", NULL, 300)
    seen = []
    real = segment_attention_forward

    def spy(module, query, key, value, attention_mask, **kw):
        seen.append((tuple(query.shape), attention_mask, kw.get("cu_seq_lens_q")))
        return real(module, query, key, value, attention_mask, **kw)

    from transformers import AttentionInterface

    AttentionInterface.register(NAME, spy)
    try:
        rows = _rows()
        batch = collate(rows, 0)
        inputs = model_inputs(model, batch, "cpu", packed=True)
        assert inputs["input_ids"].shape == (1, 2 * 22)  # B * T, T = the longer row (13 + 9)
        model(**inputs)
    finally:
        segment_attention.register()
    assert len(seen) == 2  # both layers; no (T x T) mask was built for either
    for shape, mask, cu in seen:
        assert shape[2] == 44 and mask is None
        assert cu.tolist() == [0, 5, 16, 20, 22, 35, 44]  # row 1: 5, 11, 4 and 2 of padding; row 2: 13, 9


def test_sliding_window_inside_one_example():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 20, 8, generator=g) for _ in range(3))
    module = torch.nn.Module()
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)
    out, _ = segment_attention_forward(module, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, sliding_window=5)
    i = torch.arange(20)
    same = (torch.bucketize(i, cu[1:], right=True)[:, None] == torch.bucketize(i, cu[1:], right=True)[None, :])
    gap = i[:, None] - i[None, :]
    mask = same & (gap >= 0) & (gap < 5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)


def test_gemma3_sliding_layers_agree_on_examples_longer_than_the_window():
    rows = _rows(lengths=((19, 7), (24,)))  # the tiny gemma3's window is 8
    ref, seg = _model("gemma3_text"), _model("gemma3_text")
    bind_segment_attention(seg, "cpu", NULL, 300)
    assert uses_segment_attention(seg)
    loss0, _, grads0 = _loss_and_grads(ref, rows)
    loss1, _, grads1 = _loss_and_grads(seg, rows)
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    for k, g in grads0.items():
        assert (grads1[k] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-7, k


def test_a_form_it_does_not_reproduce_keeps_the_models_own_attention():
    import transformers as T

    config = T.Gemma2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=50.0)
    torch.manual_seed(0)
    model = T.Gemma2ForCausalLM(config)
    before = model.config._attn_implementation  # transformers picks eager for softcapping
    own, note = bind_segment_attention(model, "cpu", NULL, 300)
    assert own is None and note.startswith(f"kept {before} attention: per-example attention does not serve")
    assert model.config._attn_implementation == before


def test_not_bound_on_other_devices_when_switched_off_or_for_recurrent_layers(monkeypatch):
    assert bind_segment_attention(_model("llama"), "mps", NULL, 300) == (None, None)
    assert bind_segment_attention(_model("qwen3_5"), "cpu", NULL, 300) == (None, None)
    monkeypatch.setattr(segment_attention, "SEGMENT_ATTENTION", "off")
    model = _model("llama")
    assert bind_segment_attention(model, "cpu", NULL, 300) == (None, None)
    assert not uses_segment_attention(model)


def test_restored_and_never_saved(tmp_path):
    model = _model("llama", lora=False)
    own, _ = bind_segment_attention(model, "cpu", NULL, 300)
    model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    restore_attention(model, own)
    assert model.config._attn_implementation == "sdpa" and not uses_segment_attention(model)


def test_a_call_it_cannot_serve_raises_instead_of_answering_wrong():
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError):
        segment_attention_forward(module, q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(NotImplementedError):
        segment_attention_forward(module, q, q, q, None, softcap=50.0)
    with pytest.raises(NotImplementedError):  # a KV cache: fewer queries than keys
        segment_attention_forward(module, q[:, :, :1], q, q, None)


def _reference_varlen_qk(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                         enable_gqa=False):
    """varlen_attn with more keys than queries in a span: queries aligned to the span's last keys (flash
    attention's causal alignment), example by example with sdpa."""
    assert q.dim() == 3 and cu_q.dtype == cu_k.dtype == torch.int32 and window_size[1] == 0
    bq, bk = cu_q.tolist(), cu_k.tolist()
    assert max_q == max(b - a for a, b in zip(bq, bq[1:], strict=False))
    assert max_k == max(b - a for a, b in zip(bk, bk[1:], strict=False)) and k.shape[0] == bk[-1]
    outs = []
    for (a, b), (c, d) in zip(zip(bq, bq[1:], strict=False), zip(bk, bk[1:], strict=False), strict=True):
        gap = torch.arange(b - a)[:, None] + (d - c) - (b - a) - torch.arange(d - c)[None, :]
        mask = (gap >= 0) & ((gap <= window_size[0]) if window_size[0] >= 0 else True)
        x = [t.transpose(0, 1)[None] for t in (q[a:b], k[c:d], v[c:d])]
        outs.append(F.scaled_dot_product_attention(*x, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)[0]
                    .transpose(0, 1))
    return torch.cat(outs)


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    """torch.nn.attention.varlen.varlen_attn's contract for one span of keys per span of queries (no shared
    prefix), example by example with sdpa (its kernel is CUDA's)."""
    assert torch.equal(cu_q, cu_k) and max_q == max_k
    return _reference_varlen_qk(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


@needs_varlen
@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text"])
def test_the_cuda_form_hands_varlen_attention_the_flattened_examples(arch, monkeypatch):
    """The CUDA branch's layout, boundaries and window on CPU, with a reference in varlen_attn's place: the same
    logits (bf16) as the block mask, examples longer than gemma3's window of 8 included."""
    from torch.nn.attention import varlen

    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "off")  # this reference takes no shared prefix
    rows = _rows(lengths=((19, 7), (24,)))
    ref, seg = _model(arch).to(torch.bfloat16), _model(arch).to(torch.bfloat16)
    own, note = bind_segment_attention(seg, "cpu", NULL, 300)
    assert own == "sdpa", note
    batch = collate(rows, 0)
    with torch.no_grad():
        want = ref(**model_inputs(ref, batch, "cpu", packed=True)).logits.float()
        got = seg(**model_inputs(seg, batch, "cpu", packed=True)).logits.float().reshape(want.shape)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


@needs_varlen
def test_the_probe_keeps_the_models_attention_when_examples_would_see_each_other(monkeypatch):
    """A varlen kernel that ignores the boundaries (the flattened batch attended as one sequence) fails the binding
    probe: rounding is a few percent of the logits' scale at most, a leak about all of it."""
    from torch.nn.attention import varlen

    def leaky(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        whole = torch.tensor([0, q.shape[0]], dtype=torch.int32)
        return _reference_varlen_qk(q, k, v, whole, whole, q.shape[0], k.shape[0], **kw)

    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    monkeypatch.setattr(varlen, "varlen_attn", leaky)
    model = _model("qwen2").to(torch.bfloat16)
    own, note = bind_segment_attention(model, "cpu", NULL, 300)
    assert own is None and "differs from it on a probe" in note, note
    assert not uses_segment_attention(model)


@pytest.mark.parametrize(("error", "shared"), [(0.03, True), (0.3, False)])
def test_the_shared_layout_is_bound_within_rounding_and_refused_beyond(monkeypatch, error, shared):
    """The shared-prefix probe's bar is the leak check's (packing.ISOLATION_TOLERANCE): a 4-bit base in bf16 on a
    GPU differs by ~3% of the logits' scale from rounding alone, and is still bound."""
    from mens.train import packing

    monkeypatch.setattr(packing, "shared_layout_error", lambda *a: error)
    model = _model("llama")
    own, note = bind_segment_attention(model, "cpu", NULL, 300)
    assert own == "sdpa" and shares_prefix(model) == shared, note
    assert ("differs on a probe" in note) != shared


@needs_varlen
def test_the_cuda_form_refuses_f32_and_dropout(monkeypatch):
    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    q = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="bf16 or fp16"):
        segment_attention_forward(module, q, q, q, None)
    module.train()
    with pytest.raises(NotImplementedError, match="dropout"):
        segment_attention_forward(module, q.bfloat16(), q.bfloat16(), q.bfloat16(), None, dropout=0.1)


@needs_varlen
def test_the_cuda_form_takes_an_f32_models_attention_in_autocasts_dtype(monkeypatch):
    """An f32 model under bf16 autocast hands attention f32 queries (its rotary cos/sin are f32): the CUDA form
    computes in autocast's dtype, as sdpa would, instead of refusing."""
    from torch.nn.attention import varlen

    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen_qk)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    module = torch.nn.Module().eval()
    want, _ = segment_attention_forward(module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, cu_seq_lens_q=cu)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = segment_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@needs_varlen
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text"])
def test_cuda_varlen_flash_gives_the_block_masks_loss_and_gradients(arch):
    bf16 = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    rows = _rows(lengths=((19, 7, 30), (24, 11)))
    ref, seg = _model(arch).cuda(), _model(arch).cuda()
    own, note = bind_segment_attention(seg, "cuda", bf16, 300)
    assert own == "sdpa" and "varlen flash" in note, note
    _assert_same_training_in_half_precision(ref, seg, rows, "cuda", bf16)


def test_cuda_keeps_the_models_attention_where_it_drops_attention_out():
    model = _model("llama")
    model.config.attention_dropout = 0.1
    own, note = bind_segment_attention(model, "cuda", NULL, 300)  # refused before anything runs on the device
    assert own is None and note == "kept sdpa attention: flash varlen attention has no attention dropout"


def test_cuda_without_varlen_attention_keeps_the_block_mask_and_says_why(monkeypatch):
    """torch before 2.10 has no varlen flash attention: the run keeps the model's attention, and the preflight
    note names the torch that lacks it, before anything runs on the device."""
    import torch.nn.attention as attention

    if hasattr(attention, "varlen"):
        monkeypatch.delattr(attention, "varlen")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # the import fails as on torch < 2.10
    own, note = bind_segment_attention(_model("llama"), "cuda", NULL, 300)
    assert own is None and note.startswith("kept sdpa attention over the block mask: torch ")
    assert "has no varlen flash attention" in note


# ---- a micro-batch's common prompt prefix, computed once (packing.collate_shared) ----

def _prompted_rows(seed: int = 3, head: int = 12, lengths=((5, 9), (7, 4, 6)), stranger: int = 8):
    """Rows of examples that open with the same `head` tokens (a system prompt) and are supervised from token
    head + 2, plus one example that opens differently (a row left-truncated past its prompt)."""
    g = torch.Generator().manual_seed(seed)
    opening = torch.randint(3, 300, (head,), generator=g).tolist()
    rows = []
    for row in lengths:
        exs = []
        for n in row:
            ids = opening + torch.randint(3, 300, (n,), generator=g).tolist()
            exs.append(Example(ids=ids, labels=[IGNORE] * (head + 2) + ids[head + 2:]))
        rows.append(exs)
    ids = torch.randint(3, 300, (stranger,), generator=g).tolist()
    rows[-1].append(Example(ids=ids, labels=[IGNORE] * 3 + ids[3:]))
    return rows


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"])
def test_a_shared_prefix_gives_the_per_example_loss_and_gradients(arch, monkeypatch):
    # gemma3's tiny window is 8: examples of 17-21 tokens cross it inside and across the shared prefix
    rows = _prompted_rows()
    ref, shared = _model(arch), _model(arch)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "off")
    bind_segment_attention(ref, "cpu", NULL, 300)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "auto")
    _, note = bind_segment_attention(shared, "cpu", NULL, 300)
    assert not shares_prefix(ref) and shares_prefix(shared) and "computed once" in note
    loss0, n0, grads0 = _loss_and_grads(ref, rows)
    loss1, n1, grads1 = _loss_and_grads(shared, rows)
    assert n1 == n0 and loss1 == pytest.approx(loss0, rel=1e-5)
    assert any("self_attn" in k and "lora_A" in k for k in grads0)
    for k, g in grads0.items():
        assert (grads1[k] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-7, k


def test_the_shared_layout_lays_the_prefix_out_once_and_continues_positions():
    rows = _prompted_rows()
    exs = [ex for row in rows for ex in row]
    n, group = shared_prefix(exs)
    assert (n, group) == (12, [0, 1, 2, 3, 4])  # the 12 common tokens; the stranger (5) stays whole
    batch = collate_shared(rows)
    ids, labels, pos = (batch[k][0].tolist() for k in ("input_ids", "labels", "position_ids"))
    bounds = batch["cu_seq_lens"].tolist()
    assert bounds[:2] == [0, n] and bounds[-1] == len(ids) == sum(len(e.ids) for e in exs) - 4 * n
    assert batch["shared_prefix_len"] == n and batch["shared_prefix_end"] == bounds[-2]
    assert ids[:n] == exs[0].ids[:n] and labels[:n] == [IGNORE] * n and pos[:n] == list(range(n))
    for k, i in enumerate(group):  # each sharing example: its tokens after the prefix, positions from n
        a, b = bounds[k + 1], bounds[k + 2]
        assert ids[a:b] == exs[i].ids[n:] and labels[a:b] == exs[i].labels[n:]
        assert pos[a:b] == list(range(n, len(exs[i].ids))) and labels[a] == IGNORE
    assert ids[bounds[-2]:] == exs[5].ids and pos[bounds[-2]:] == list(range(len(exs[5].ids)))
    # the CUDA form's keys: each sharing example gathers the prefix, then its own tokens; the stranger its own
    keys, key_bounds = batch["key_index"].tolist(), batch["cu_seq_lens_k"].tolist()
    assert key_bounds[1] == n and keys[:n] == list(range(n))
    for k in range(len(group)):
        a, b = bounds[k + 1], bounds[k + 2]
        assert keys[key_bounds[k + 1]:key_bounds[k + 2]] == list(range(n)) + list(range(a, b))
    assert keys[key_bounds[-2]:] == list(range(bounds[-2], bounds[-1]))
    # the supervised tokens are exactly the examples' own
    assert sorted(x for x in labels if x != IGNORE) == sorted(x for e in exs for x in e.labels if x != IGNORE)


def test_the_prefix_never_holds_a_position_that_predicts_a_supervised_token():
    a = Example(ids=list(range(10, 30)), labels=[IGNORE] * 10 + list(range(20, 30)))
    b = Example(ids=list(range(10, 40)), labels=[IGNORE] * 15 + list(range(25, 40)))
    assert shared_prefix([a, b]) == (9, [0, 1])  # a's token 10 is supervised: the prefix ends at its predecessor
    early = Example(ids=list(range(10, 30)), labels=[IGNORE] * 5 + list(range(15, 30)))
    assert shared_prefix([early, b]) == (0, [])  # a 4-token prefix is below MIN_SHARED_PREFIX
    assert shared_prefix([a]) == (0, [])
    other = Example(ids=list(range(50, 80)), labels=[IGNORE] * 20 + list(range(70, 80)))
    assert shared_prefix([a, other]) == (0, [])  # nothing in common: a group of one
    assert collate_shared([[a], [other]]) is None


def test_sharing_is_not_bound_when_switched_off_and_is_dropped_on_restore(monkeypatch):
    model = _model("llama")
    own, _ = bind_segment_attention(model, "cpu", NULL, 300)
    assert shares_prefix(model)
    restore_attention(model, own)
    assert not shares_prefix(model)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "off")
    bind_segment_attention(model, "cpu", NULL, 300)
    assert uses_segment_attention(model) and not shares_prefix(model)
    q = torch.randn(1, 2, 6, 8).bfloat16()
    monkeypatch.setattr(segment_attention, "_use_flash", lambda query: True)
    with pytest.raises(NotImplementedError, match="key positions"):  # the CUDA form without its key index
        segment_attention_forward(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 3, 6]),
                                  shared_prefix_len=3, shared_prefix_end=6)


@needs_varlen
def test_the_cuda_form_calls_a_varlen_attn_without_enable_gqa_as_torch_2_11_has_it(monkeypatch):
    """torch 2.11's varlen_attn takes no `enable_gqa` (its flash kernel serves fewer key heads by itself); torch
    2.13's asks for it. Grouped-query keys reach either, and give the same attention."""
    from torch.nn.attention import varlen

    def varlen_2_11(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
        return _reference_varlen_qk(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size,
                                    enable_gqa=q.shape[1] != k.shape[1])

    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 7, 8, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 7, 8, generator=g).bfloat16() for _ in range(2))  # 2 key heads for 4 query heads
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    module = torch.nn.Module().eval()
    outs = []
    for fn in (varlen_2_11, _reference_varlen_qk):
        monkeypatch.setattr(varlen, "varlen_attn", fn)
        outs.append(segment_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu)[0])
    assert torch.equal(*outs)


@needs_varlen
@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text"])
def test_the_cuda_form_of_a_shared_prefix_gives_the_per_example_loss_and_gradients(arch, monkeypatch):
    """The CUDA branch's gathered keys on CPU, with a reference in varlen_attn's place (bf16): the loss and
    gradients of the per-example layout, gemma3's window of 8 crossed inside and across the prefix."""
    from torch.nn.attention import varlen

    monkeypatch.setattr(segment_attention, "_use_flash", lambda q: True)
    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen_qk)
    rows = _prompted_rows()
    ref, shared = _model(arch).to(torch.bfloat16), _model(arch).to(torch.bfloat16)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "off")
    bind_segment_attention(ref, "cpu", NULL, 300)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "auto")
    _, note = bind_segment_attention(shared, "cpu", NULL, 300)
    assert shares_prefix(shared) and not shares_prefix(ref), note
    assert _loss_and_grads(ref, rows)[1] == _loss_and_grads(shared, rows)[1]  # the same supervised tokens
    _assert_same_training_in_half_precision(ref, shared, rows, "cpu", NULL)


@needs_varlen
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text"])
def test_cuda_shared_prefix_gives_the_per_example_loss_and_gradients(arch, monkeypatch):
    bf16 = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    rows = _prompted_rows()
    ref, shared = _model(arch).cuda(), _model(arch).cuda()
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "off")
    bind_segment_attention(ref, "cuda", bf16, 300)
    monkeypatch.setattr(segment_attention, "SHARED_PREFIX", "auto")
    _, note = bind_segment_attention(shared, "cuda", bf16, 300)
    assert shares_prefix(shared) and "computed once" in note, note
    _assert_same_training_in_half_precision(ref, shared, rows, "cuda", bf16)


def test_the_preflight_leak_check_covers_the_shared_layout(monkeypatch):
    from mens.train import packing
    from mens.train.preflight import packing_leaks

    model = _model("llama")
    bind_segment_attention(model, "cpu", NULL, 300)
    assert not packing_leaks(model, "cpu", NULL, 300)
    real = packing.collate_shared

    def no_prefix_attention(rows):  # sharing examples that no longer attend to the prefix: a wrong layout
        batch = real(rows)
        batch["shared_prefix_end"] = batch["shared_prefix_len"]
        return batch

    monkeypatch.setattr(packing, "collate_shared", no_prefix_attention)
    assert packing_leaks(model, "cpu", NULL, 300)


def _short_examples(g, heads=(4, 2), n=9, d=8):
    q = torch.randn(1, heads[0], n, d, generator=g)
    k, v = (torch.randn(1, heads[1], n, d, generator=g) for _ in range(2))
    return q, k, v, torch.tensor([0, 3, n], dtype=torch.int32)


def test_short_examples_under_cpu_bf16_autocast_attend_in_f32(monkeypatch):
    """Under CPU bf16 autocast, a call whose examples are at most F32_ATTENTION_MAX_TOKENS long is the f32 attention
    of the same inputs, handed back in bf16 as autocast would; a longer one (or the knob at 0) stays in bf16."""
    g = torch.Generator().manual_seed(0)
    q, k, v, cu = _short_examples(g)
    module = torch.nn.Module().eval()
    exact, _ = segment_attention_forward(module, q, k, v.bfloat16().float(), None, cu_seq_lens_q=cu)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = segment_attention_forward(module, q, k, v.bfloat16(), None, cu_seq_lens_q=cu)
        monkeypatch.setattr(segment_attention, "F32_ATTENTION_MAX_TOKENS", 5)  # the second example has 6 tokens
        half, _ = segment_attention_forward(module, q, k, v.bfloat16(), None, cu_seq_lens_q=cu)
    assert got.dtype == torch.bfloat16 and torch.equal(got, exact.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and not torch.equal(half, got)
    assert (half.float() - exact).abs().max() <= 0.05 * exact.abs().max()  # bf16 rounding apart


def test_the_f32_form_counts_a_shared_prefix_and_passes_gradients_back_in_their_dtypes(monkeypatch):
    g = torch.Generator().manual_seed(1)
    q, k, v, _ = _short_examples(g, n=10)
    cu = torch.tensor([0, 4, 7, 10], dtype=torch.int32)  # a 4-token prefix, then two examples of 3 sharing it
    module = torch.nn.Module().eval()
    monkeypatch.setattr(segment_attention, "F32_ATTENTION_MAX_TOKENS", 7)  # 3 + the prefix's 4: in f32
    q.requires_grad_(True)
    vb = v.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = segment_attention_forward(module, q, k, vb, None, cu_seq_lens_q=cu, shared_prefix_len=4,
                                           shared_prefix_end=10)
    exact, _ = segment_attention_forward(module, q.detach().clone().requires_grad_(True), k,
                                         v.bfloat16().float(), None, cu_seq_lens_q=cu, shared_prefix_len=4,
                                         shared_prefix_end=10)  # with gradients, as `out` (the kernel differs)
    assert torch.equal(out, exact.to(torch.bfloat16))
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and vb.grad.dtype == torch.bfloat16
    monkeypatch.setattr(segment_attention, "F32_ATTENTION_MAX_TOKENS", 6)  # the prefix makes them 7: bf16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half, _ = segment_attention_forward(module, q.detach(), k, v.bfloat16(), None, cu_seq_lens_q=cu,
                                            shared_prefix_len=4, shared_prefix_end=10)
    assert not torch.equal(half, out)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bound_under_cpu_bf16_autocast_it_trains_as_the_block_mask(arch):
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    rows = _rows()
    ref, seg = _model(arch), _model(arch)
    own, _ = bind_segment_attention(seg, "cpu", bf16, 300)
    assert own == "sdpa" and uses_segment_attention(seg)
    _assert_same_training_in_half_precision(ref, seg, rows, "cpu", bf16)
