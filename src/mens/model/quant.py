"""4-bit NF4 quantization config for QLoRA (bitsandbytes; works on CPU and CUDA)."""

from __future__ import annotations


def compute_dtype(device: str):
    """bf16 compute on GPUs that support it, f32 elsewhere (bf16 matmuls on CPU are slow and lossy)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def nf4_config(device: str):
    """`BitsAndBytesConfig` for NF4 + double quantization with the device's compute dtype."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype(device))


def keep_trainable_layout(model) -> None:
    """Stop bitsandbytes from repacking NF4 weights into its CPU inference layout.

    On CPUs with AVX512-BF16, `Linear4bit.forward` in eval mode without grad permanently repacks the weight for
    a kernel that has no autograd; training after an eval pass would then back-propagate wrong input gradients.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
