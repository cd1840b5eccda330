"""`mens pretrain`: the Vox lab model, a small decoder-only transformer trained from scratch on Vox source.

It uses the 133-token lab tokenizer and a Llama-architecture config, and is saved as a plain Hugging Face
directory, so train (fine-tuning), eval-local, merge and serve work on it unchanged. After training it
generates from declaration-starting prompts and reports the share of outputs the language frontend parses.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mens.errors import DataError
from mens.run_records import TELEMETRY

PROMPTS = ("fn ", "pub fn ", "type ", "@table type ", "@test\nfn ", "component ", "@endpoint(kind: query)\nfn ",
           "import ", "let ", "fn main() {\n")


@dataclass
class PretrainConfig:
    steps: int = 300
    """Optimizer steps."""
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    seed: int = 0
    sample_tokens: int = 160
    """Tokens generated per prompt for the parse-share check."""


def collect_sources(paths: list[Path], extensions: tuple[str, ...]) -> list[str]:
    texts = []
    for p in paths:
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(extensions))
        elif p.is_file():
            files = [p]
        else:
            raise DataError(f"{p}: no such file or folder; pass .vox files or folders holding them")
        texts += [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if not texts:
        raise DataError(f"no source files ({', '.join(extensions)}) under {', '.join(map(str, paths))}")
    return texts


def _strip_header(text: str) -> str:
    """Drop leading `//` comment lines (golden frontmatter): the lab model should learn code, not headers."""
    lines = text.splitlines(keepends=True)
    while lines and (lines[0].lstrip().startswith("//") or not lines[0].strip()):
        lines.pop(0)
    return "".join(lines)


def build_lab_model(vocab_size: int, cfg: PretrainConfig):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_model * 3,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, max_position_embeddings=max(512, cfg.seq_len),
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config)


def _lr(step: int, cfg: PretrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _cut_decl(text: str) -> str:
    """The generated text up to the first blank line: one top-level declaration."""
    cut = text.find("\n\n")
    return text if cut < 0 else text[: cut + 1]


def parse_share(model, tok, lang, cfg: PretrainConfig) -> tuple[float, list[dict]]:
    """Greedy generation from each prompt; the share whose first declaration parses (and is code)."""
    from mens.model.generate import stream_tokens

    samples = []
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        out = "".join(stream_tokens(model, tok, ids, max_new_tokens=cfg.sample_tokens, stop_ids={tok.eos_token_id}))
        code = _cut_decl(prompt + out)
        samples.append({"prompt": prompt, "output": code, "parses": lang.parse(code).has_code})
    return sum(s["parses"] for s in samples) / len(samples), samples


def pretrain(paths: list[Path], out_dir: Path, cfg: PretrainConfig, *, language: str = "vox", progress=None) -> dict:
    """Train the lab model from scratch on the sources under `paths`; write a Hugging Face dir to `out_dir`."""
    import torch

    from mens.lang import get_language
    from mens.model.lab_tokenizer import build_lab_tokenizer

    lang = get_language(language)
    tok = build_lab_tokenizer()
    texts = [_strip_header(t) for t in collect_sources(paths, lang.file_extensions)]
    stream: list[int] = []
    for t in texts:  # documents separated by <eos>
        stream += tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    if len(stream) < 2 * (cfg.seq_len + 2):
        raise DataError(f"only {len(stream)} tokens of source; the lab model needs at least {2 * (cfg.seq_len + 2)} "
                        f"for seq_len={cfg.seq_len} (add sources or lower --seq-len)")
    data = torch.tensor(stream)
    n_val = max(cfg.seq_len + 2, len(stream) // 20)
    train, val = data[:-n_val], data[-n_val:]
    model = build_lab_model(len(tok), cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    rng = random.Random(cfg.seed)
    out_dir.mkdir(parents=True, exist_ok=True)

    def batch():
        starts = [rng.randrange(0, len(train) - cfg.seq_len - 1) for _ in range(cfg.batch_size)]
        x = torch.stack([train[s : s + cfg.seq_len] for s in starts])
        return x, torch.stack([train[s + 1 : s + cfg.seq_len + 1] for s in starts])

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        n = (len(val) - 1) // cfg.seq_len
        x, y = val[: n * cfg.seq_len].view(n, -1)[:8], val[1 : n * cfg.seq_len + 1].view(n, -1)[:8]
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten())
        model.train()
        return float(loss)

    started, losses = time.perf_counter(), []
    model.train()
    with (out_dir / TELEMETRY).open("w", encoding="utf-8") as telemetry:
        for step in range(cfg.steps):
            lr = _lr(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = batch()
            logits = model(input_ids=x).logits  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
            losses.append(loss.item())
            elapsed = time.perf_counter() - started
            telemetry.write(json.dumps({"event": "step", "step": step + 1, "loss": losses[-1], "lr": lr,
                                        "grad_norm": grad_norm,
                                        "tokens_per_s": (step + 1) * cfg.batch_size * cfg.seq_len / elapsed}) + "\n")
            if (step + 1) % max(1, cfg.steps // 5) == 0 or step + 1 == cfg.steps:
                telemetry.write(json.dumps({"event": "eval", "step": step + 1, "val_loss": val_loss()}) + "\n")
            if progress:
                progress(step + 1, cfg.steps, losses[-1])
    model.eval()
    share, samples = parse_share(model, tok, lang, cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    summary = {"config": asdict(cfg), "tokens": len(stream), "documents": len(texts),
               "parameters": sum(p.numel() for p in model.parameters()), "initial_loss": losses[0],
               "final_loss": sum(losses[-10:]) / len(losses[-10:]), "val_loss": val_loss(),
               "wall_time_s": round(time.perf_counter() - started, 2), "parse_share": share, "samples": samples}
    (out_dir / "pretrain_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
