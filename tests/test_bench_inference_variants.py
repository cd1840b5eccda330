"""bench/inference_variants.py: the scaled variant's adapter is the trained LoRA update times the scale, as peft
loads it (the base's output plus scale times the adapter's change to it), per-module alphas included, and the copy
leaves checkpoints out."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import inference_variants  # noqa: E402


def _tiny_base():
    """The same tiny llama every call (peft wraps a base in place, so each adapter load gets its own)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def _tiny_lora_run(path: Path):
    import torch
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(_tiny_base(), lora)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the update a size
            torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(path)
    (path / "checkpoints" / "step-1").mkdir(parents=True)
    return model.eval()


def test_scaled_copy_scales_the_lora_update_and_leaves_checkpoints_out(tmp_path):
    import torch
    from peft import PeftModel

    run = tmp_path / "run"
    model = _tiny_lora_run(run)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        tuned = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
    (tmp_path / "out").mkdir()
    copy = inference_variants.scaled_copy(run, 0.5, tmp_path / "out")

    assert not (copy / "checkpoints").exists() and (run / "checkpoints").exists()
    assert json.loads((copy / "adapter_config.json").read_text())["lora_alpha"] == 4.0
    assert json.loads((run / "adapter_config.json").read_text())["lora_alpha"] == 8
    scaled = PeftModel.from_pretrained(_tiny_base(), copy).eval()
    with torch.no_grad():
        half = scaled(ids).logits
    assert (tuned - plain).abs().max() > 1e-2  # the update moves the logits, so the check below can fail
    # q/v enter attention non-linearly, so compare a layer's own output: down_proj of layer 0 on the same input
    x = torch.randn(1, 3, 64)
    down_full = model.base_model.model.model.layers[0].mlp.down_proj
    down_half = scaled.base_model.model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        w = down_full.base_layer(x)
        assert torch.allclose(down_half(x) - w, 0.5 * (down_full(x) - w), atol=1e-6)
    assert not torch.allclose(half, tuned)


def test_scaled_copy_scales_per_module_alphas_too(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "alpha_pattern": {"q_proj": 16}}))
    (tmp_path / "out").mkdir()
    cfg = json.loads((inference_variants.scaled_copy(run, 0.5, tmp_path / "out") / "adapter_config.json").read_text())
    assert cfg["lora_alpha"] == 4.0 and cfg["alpha_pattern"] == {"q_proj": 8.0}
