"""Tiny configs (hidden 32, 2 layers; hybrids one linear-attention + one full-attention layer) for every
architecture mens discovers LoRA targets on, and the linear modules a test expects adapted."""

from __future__ import annotations

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_5", "qwen3_next", "qwen3_moe", "gemma3_text", "phi3", "mistral")
HYBRID = ("linear_attention", "full_attention")  # both layer kinds of Qwen3.5 / Qwen3-Next in two layers
_LINEAR_ATTN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                    linear_conv_kernel_dim=4, layer_types=list(HYBRID))
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[])


def tiny_model(arch: str, vocab: int = 300, eos: int = 1, pad: int = 1, seed: int = 0):
    """A freshly initialised tiny causal LM of `arch` (deterministic for a seed)."""
    import torch
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=eos, pad_token_id=pad,
                  tie_word_embeddings=True, initializer_range=0.2)
    hd = dict(head_dim=8)
    table = {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
        "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, hd),
        "qwen3_5": (T.Qwen3_5TextConfig, T.Qwen3_5ForCausalLM, {**hd, **_LINEAR_ATTN}),
        "qwen3_next": (T.Qwen3NextConfig, T.Qwen3NextForCausalLM,
                       {**hd, **_LINEAR_ATTN, **_MOE, "shared_expert_intermediate_size": 16}),
        "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM, {**hd, **_MOE}),
        "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                        {**hd, "sliding_window": 8, "query_pre_attn_scalar": 8,
                         "layer_types": ["sliding_attention", "full_attention"]}),
        "phi3": (T.Phi3Config, T.Phi3ForCausalLM, {"bos_token_id": eos}),
        "mistral": (T.MistralConfig, T.MistralForCausalLM, hd),
    }
    config_cls, model_cls, extra = table[arch]
    torch.manual_seed(seed)
    return model_cls(config_cls(**common, **extra))


def build_arch_dir(path, arch: str):
    """A model directory (weights + the tiny byte-level tokenizer with a ChatML template) for `arch`."""
    from train_tiny import build_tokenizer

    tok = build_tokenizer()
    # Room above the tokenizer, as real models have: transformers loads some families' own tokenizer class
    # (Qwen2Tokenizer), which adds <|endoftext|> to this byte-level one.
    tiny_model(arch, vocab=len(tok) + 16, eos=tok.eos_token_id, pad=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def expected_targets(model) -> tuple[set[str], set[str]]:
    """Independent count: every nn.Linear under model.model.layers except MoE routers/gates, and every 3-D
    parameter of an `experts` module."""
    import torch

    modules, params = set(), set()
    for name, module in model.model.layers.named_modules(prefix="model.layers"):
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and leaf not in ("gate", "shared_expert_gate"):
            modules.add(name)
        if leaf == "experts":
            params |= {f"{name}.{p}" for p, v in module.named_parameters(recurse=False) if v.dim() == 3}
    return modules, params


def live_lora(model, r: int = 4, alpha: int = 8, dropout: float = 0.0, seed: int = 0):
    """`model` with LoRA adapters whose B is drawn non-zero, so every LoRA branch shows in the output and the
    gradients (deterministic for a seed)."""
    import torch

    from mens.model.lora import attach_lora

    torch.manual_seed(seed)
    model = attach_lora(model, r=r, alpha=alpha, dropout=dropout)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if hasattr(module, "lora_B"):
            with torch.no_grad():
                w = module.lora_B["default"].weight
                w.copy_(torch.randn(w.shape, generator=gen) * 0.1)  # drawn on the CPU: the same on any device
    return model


def loss_and_grads(model, autocast=None):
    """Loss and the trainable parameters' gradients (cloned, by name) of one forward and backward on a fixed
    (2, 16) batch of token ids, under `autocast()` when given."""
    import contextlib

    import torch

    ids = torch.randint(2, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    with (autocast or contextlib.nullcontext)():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
