"""Tiny models and data built in code: a byte-level BPE with a ChatML template, 2-layer Llama/Qwen2 dirs."""

from __future__ import annotations

import json
import random

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAMES = ["add", "sub", "mul", "inc", "dec", "neg", "sq", "half", "twice", "zero", "one", "max", "min", "abs"]


def vox_rows(n: int = 40, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name = NAMES[i % len(NAMES)] + str(i)
        k = rng.randint(1, 9)
        if i % 5 == 4:
            answer = f"fn {name}(a: int) -> int {{ return a * {k} }}"
            rows.append({"messages": [{"role": "user", "content": f"write {name}"},
                                      {"role": "assistant", "content": answer}], "category": "fn"})
        else:
            rows.append({"prompt": f"Write a function {name} that adds {k}.",
                         "response": f"fn {name}(a: int) -> int {{\n    return a + {k}\n}}", "category": "fn"})
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def build_tokenizer(vocab_size: int = 300):
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [r.get("prompt", "") + " " + r.get("response", "") for r in vox_rows(60)] + ["system user assistant"] * 5
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    hf.chat_template = CHATML
    return hf


def build_model_dir(path, arch: str = "llama", hidden: int = 64):
    import torch
    import transformers

    torch.manual_seed(0)
    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
                  initializer_range=0.2)  # large enough that frozen embeddings allow confident logits
    if arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_config(data_dir, out, model_dir, **over):
    from mens.train.config import TrainConfig

    kw = dict(data=str(data_dir), output_dir=str(out), model=str(model_dir), backend="lora", device="cpu",
              max_steps=6, seq_len=96, batch_size=4, grad_accum=1, learning_rate=1e-2, warmup_steps=0, r=4,
              lora_alpha=8, lora_dropout=0.0, val_fraction=0.1, eval_every=3, save_every=3, min_examples=10,
              num_threads=1, system_prompt="You write Vox.")
    kw.update(over)
    return TrainConfig(**kw)
