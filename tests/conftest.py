"""Shared fixtures: offline hub, the shared Vox corpus (skipped cleanly when absent), GPU skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_VOX = Path(os.environ.get("MENS_SHARED_VOX", REPO_ROOT.parent / "shared" / "corpus" / "vox"))


@pytest.fixture(scope="session")
def shared_vox() -> Path:
    """The shared real Vox corpus (../shared/corpus/vox); tests that need it skip when it is absent."""
    if not (SHARED_VOX / "expected_parse_results.jsonl").is_file():
        pytest.skip(f"shared Vox corpus not found at {SHARED_VOX} (set MENS_SHARED_VOX to point at it)")
    return SHARED_VOX


def pytest_collection_modifyitems(config, items):
    # GPU-only paths are marked `gpu` and skipped without CUDA (never import torch just to collect).
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer(texts=None, vocab_size: int = 280):
    """A byte-level BPE trained in-process (well under a second) with a ChatML template."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts or ["fn add(a: int) to int { return a + 1 }"] * 10, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    hf.chat_template = CHAT_TEMPLATE
    return hf


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory):
    """A 2-layer Llama whose tokenizer was trained on the embedded Vox programs (`mens dogfood`'s base in tests)."""
    import torch
    import transformers

    from mens.corpus.extract import embedded_root

    texts = [p.read_text() for p in sorted(embedded_root("vox").glob("*.vox"))]
    tok = build_tiny_tokenizer(texts, vocab_size=400)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    base = tmp_path_factory.mktemp("tiny") / "base"
    transformers.LlamaForCausalLM(cfg).save_pretrained(base)
    tok.save_pretrained(base)
    return base


def tiny_dogfood_config(out, base, **kw):
    """A `mens dogfood` on `tiny_base` that runs every stage in seconds: 3 steps, 2 held-out tasks, 12 tokens."""
    from mens.dogfood import DogfoodConfig

    settings = {"model": str(base), "quick": True, "train": {"schedule.max_steps": 3}, "limit": 2,
                "max_new_tokens": 12, "synthetic": 30, "tasks": 30,
                "modes": ("greedy", "constrained"), "device": "cpu", **kw}
    return DogfoodConfig(output_dir=out, **settings)


@pytest.fixture
def make_tiny_run(tmp_path):
    """Factory: a run directory (tiny Llama base + non-zero LoRA adapter + manifest) built with peft directly."""

    def make(backend: str = "lora", name: str = "run"):
        import json

        import peft
        import torch
        import transformers

        from mens.model.load import weights_sha256

        torch.manual_seed(0)
        tok = build_tiny_tokenizer()
        cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=256, eos_token_id=tok.eos_token_id)
        base_dir, run = tmp_path / f"{name}-base", tmp_path / name
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
        manifest = {"backend": backend, "base_model_path": str(base_dir),
                    "base_weights_sha256": weights_sha256(base_dir), "system_prompt": "You write Vox."}
        (run / "training_manifest.json").write_text(json.dumps(manifest))
        return model, run, base_dir

    return make


def build_tiny_chat_lm(arch: str = "llama"):
    """A 2-layer chat LM (Llama, or GPT-2 with learned positions) and a BPE tokenizer trained in-process."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["fn add(a: int) to int { return a + 1 }", "hello world 0123456789"] * 20, trainer)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                  pad_token="<|im_end|>")
    hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    if arch == "gpt2":  # learned absolute positions: wrong position ids would change the answers
        cfg = transformers.GPT2Config(vocab_size=len(hf_tok), n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                      eos_token_id=hf_tok.eos_token_id)
        return transformers.GPT2LMHeadModel(cfg).eval(), hf_tok
    cfg = transformers.LlamaConfig(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, eos_token_id=hf_tok.eos_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, hf_tok


def teach_answer(model, tok, prompts: list[list[int]], answer: str, steps: int = 60):
    """Train `model` (in place, then eval mode) to answer every prompt with `answer` and its end token, so that
    its greedy answer is a text that tokenizes back to the same ids (a random model's seldom does)."""
    import torch

    ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        for p in prompts:
            x = torch.tensor([p + ids])
            labels = torch.tensor([[-100] * len(p) + ids])
            model(input_ids=x, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()
