"""Merge parity: merged weights loaded with plain transformers give the logits of base + adapter."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from mens.errors import ModelError, UsageError  # noqa: E402
from mens.merge.merge import merge_adapter, weights_sha256  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["fn add(a: int) to int { return a + 1 }"] * 10, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _make_run(tmp_path, backend: str):
    torch.manual_seed(0)
    tok = _tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base_dir, run = tmp_path / "base", tmp_path / "run"
    transformers.LlamaForCausalLM(cfg).save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    kwargs = {}
    if backend == "qlora":
        kwargs = {"quantization_config": transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32), "device_map": "cpu"}
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, **kwargs)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                           init_lora_weights=False)  # random, non-zero B: the adapter provably changes outputs
    model = peft.get_peft_model(base, lcfg).eval()
    model.save_pretrained(run)
    tok.save_pretrained(run)
    (run / "training_manifest.json").write_text(json.dumps(
        {"backend": backend, "base_model_path": str(base_dir), "base_weights_sha256": weights_sha256(base_dir),
         "system_prompt": "You write Vox."}))
    return model, run, base_dir


# bitsandbytes' CPU 4-bit matmul runs in bf16 (its quant state is bf16), so a QLoRA run agrees with its
# f32 dequantized merge to bf16 precision only; LoRA on an f32 base agrees to f32 precision.
@pytest.mark.parametrize(("backend", "atol"), [("lora", 1e-5), ("qlora", 5e-3)])
def test_merged_dir_matches_base_plus_adapter(tmp_path, backend, atol):
    model, run, base_dir = _make_run(tmp_path, backend)
    ids = torch.tensor([[1, 5, 9, 20, 33, 7]])
    with torch.no_grad():
        want = model(ids).logits
        base_only = transformers.AutoModelForCausalLM.from_pretrained(base_dir)(ids).logits
    assert (want - base_only).abs().max() > 1e-3  # the adapter matters
    out = merge_adapter(run, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        got = merged(ids).logits
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            "external_serving_handoff_v1.json", "Modelfile"} <= names
    gen = json.loads((out / "generation_config.json").read_text())
    im_end = transformers.AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>")
    assert im_end in (gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])
    modelfile = (out / "Modelfile").read_text()
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "You write Vox." in modelfile
    handoff = json.loads((out / "external_serving_handoff_v1.json").read_text())
    assert handoff["schema"] == "vox_external_serving_handoff_v1"
    assert "--enable-lora" in handoff["commands"]["vllm_base_plus_lora"]


def test_merge_refuses_bad_inputs(tmp_path):
    _, run, base_dir = _make_run(tmp_path, "lora")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    with pytest.raises(UsageError, match="exists"):
        merge_adapter(run, tmp_path / "taken")
    assert (tmp_path / "taken" / "x").read_text() == "keep me"
    manifest = json.loads((run / "training_manifest.json").read_text())
    manifest["base_weights_sha256"] = "0" * 64
    (run / "training_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="sha256"):
        merge_adapter(run, tmp_path / "m2")
    (run / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelError, match="no adapter"):
        merge_adapter(run, tmp_path / "m3")
