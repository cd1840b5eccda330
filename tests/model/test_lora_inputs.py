"""Under autocast, adapted projections take their input in the autocast dtype (no f32 copy per projection), and
the loss and adapter gradients are exactly those of peft's default casting."""

import copy

import pytest
import torch

from mens.model.lora import attach_lora, keep_inputs_in_autocast_dtype


def _tiny_bf16_lora():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16)  # a bf16 base, as LoRA loads it on a GPU
    model = attach_lora(model, r=4, alpha=8, dropout=0.0)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    return model


def _loss_and_grads(model, ids):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_autocast_inputs_match_peft_casting_exactly():
    model = _tiny_bf16_lora()
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    ref_loss, ref_grads = _loss_and_grads(model, ids)

    fast = copy.deepcopy(model)
    assert keep_inputs_in_autocast_dtype(fast) == 2 * 7  # every adapted projection of both layers
    seen = []
    lora_a = next(m for n, m in fast.named_modules() if n.endswith("q_proj.lora_A.default"))
    lora_a.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    loss, grads = _loss_and_grads(fast, ids)
    assert seen == [torch.bfloat16]  # no f32 copy of the activations on the adapter path
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for n, g in grads.items():
        assert torch.equal(g, ref_grads[n]), n


def test_without_autocast_the_default_casting_stays_needed():
    model = _tiny_bf16_lora()
    keep_inputs_in_autocast_dtype(model)
    with pytest.raises(RuntimeError):  # bf16 input, f32 adapter weights: why mens only does this under autocast
        model(input_ids=torch.tensor([[3, 4, 5]]))
