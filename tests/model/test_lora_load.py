"""Loading a saved adapter through mens (eval, serve, merge) is plain peft, without transformers' deprecation
warning that peft's wrapper triggers on every load (nothing a user can act on)."""

import warnings

import torch

from mens.model.lora import attach_lora, load_adapter


def _tiny_base():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _deprecations(call) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in seen if "is_gradient_checkpointing" in str(w.message)]


def test_load_adapter_is_peft_without_the_deprecation_warning(tmp_path):
    from peft import PeftModel

    tuned, warned = _deprecations(lambda: attach_lora(_tiny_base(), r=4, alpha=8, dropout=0.0))
    assert warned == []
    for n, p in tuned.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    tuned.save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 13]])

    loaded, warned = _deprecations(lambda: load_adapter(_tiny_base(), tmp_path))
    assert warned == [] and isinstance(loaded, PeftModel)
    plain = PeftModel.from_pretrained(_tiny_base(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, plain(input_ids=ids).logits)
        assert torch.allclose(loaded(input_ids=ids).logits, tuned(input_ids=ids).logits, atol=1e-6)
