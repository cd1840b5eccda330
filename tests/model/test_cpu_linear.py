"""oneDNN-packed linear layers for CPU decoding: same outputs and answers as torch's own path, gradients untouched,
LoRA layers left to peft, and off where the build or the memory says no."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import build_tiny_chat_lm  # noqa: E402

from mens.model import cpu_linear  # noqa: E402
from mens.model.batch_decode import generate_greedy_batch  # noqa: E402
from mens.model.generate import chat_input_ids  # noqa: E402

needs_onednn = pytest.mark.skipif(not cpu_linear.packing_available(), reason="this torch build has no oneDNN")
PROMPTS = ["add one", "hello world hello", "fn add(a: int) to int { return a + 1 } and then", "9"]


def _linears(model) -> int:
    return sum(type(m) is torch.nn.Linear for m in model.modules())


def _packed(model) -> int:
    return sum("forward" in vars(m) for m in model.modules())


@needs_onednn
def test_packed_model_gives_the_same_logits_and_answers():
    model, tok = build_tiny_chat_lm("llama")
    plain = copy.deepcopy(model)
    assert cpu_linear.pack_linears(model) == _linears(model) == _packed(model) > 0
    prompts = [chat_input_ids(tok, [{"role": "user", "content": p}], "You write code.") for p in PROMPTS]
    ids = torch.tensor([prompts[2]])
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), float((a - b).abs().max())
    want = generate_greedy_batch(plain, tok, prompts, max_new_tokens=24, batch_size=3)
    got = generate_greedy_batch(model, tok, prompts, max_new_tokens=24, batch_size=3)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@needs_onednn
def test_gradients_take_the_layers_own_path():
    model, _ = build_tiny_chat_lm("llama")
    plain = copy.deepcopy(model)
    cpu_linear.pack_linears(model)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    model(input_ids=ids, labels=ids).loss.backward()
    plain(input_ids=ids, labels=ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, atol=1e-6), name


@needs_onednn
def test_a_changed_or_replaced_weight_is_seen():
    model, _ = build_tiny_chat_lm("llama")
    cpu_linear.pack_linears(model)
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # what merging an adapter into the base does
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight), atol=1e-5)
        other = torch.nn.Parameter(torch.randn_like(layer.weight))
        while other._version < layer.weight._version:
            other.add_(0.0)
        assert other._version == layer.weight._version  # a new tensor at the same version: only its place differs
        layer.weight = other
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight), atol=1e-5)


@needs_onednn
def test_lora_layers_are_left_to_peft(make_tiny_run):
    from mens.model.inference import load_for_inference

    model, run, _ = make_tiny_run()
    loaded = load_for_inference(run, device="cpu")
    names = [n for n, m in loaded.model.named_modules() if "forward" in vars(m)]
    assert names and not any("lora_" in n for n in names)
    assert sum(n.endswith(".base_layer") for n in names) == 6  # q, v and down of 2 layers carry an adapter
    assert len(names) == _linears(loaded.model) - 12  # every other linear but lora_A and lora_B
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, loaded.model(input_ids=ids).logits, atol=1e-5)


def test_nothing_is_packed_without_onednn_or_memory(monkeypatch):
    model, _ = build_tiny_chat_lm("llama")
    monkeypatch.setattr(cpu_linear, "packing_available", lambda: False)
    assert cpu_linear.pack_linears(model) == 0 and _packed(model) == 0
    monkeypatch.undo()
    monkeypatch.setattr(cpu_linear, "PACK_SHARE_OF_FREE_MEMORY", 0.0)
    assert cpu_linear.pack_linears(model) == 0 and _packed(model) == 0


def test_other_dtypes_are_not_packed():
    model, _ = build_tiny_chat_lm("llama")
    model.to(torch.bfloat16)
    assert cpu_linear.pack_linears(model) == 0
