"""Resolve and load base models and tokenizers for training: local directory, hub id or embedded default."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from mens.errors import ModelError
from mens.model.embedded import EMBEDDED, ensure_embedded

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Used when the tokenizer has no chat template of its own."""


def resolve_model(spec: str) -> tuple[Path, str]:
    """(local directory, model id) for a local dir, an embedded name or a hub id (downloaded when reachable)."""
    if spec in EMBEDDED:
        return ensure_embedded(spec), EMBEDDED[spec][2]
    p = Path(spec).expanduser()
    if p.is_dir():
        return p.resolve(), str(p.resolve())
    if p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelError(f"--model {spec!r}: not a model directory, an embedded model ({', '.join(EMBEDDED)}) "
                         "or a hub id like org/name")
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    except Exception as e:  # offline, unknown repo, gated: one clear message
        first = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
        raise ModelError(f"--model {spec!r}: could not fetch it from the Hugging Face hub ({type(e).__name__}: "
                         f"{first}). Offline? Download it elsewhere and pass the local directory, or use the "
                         "embedded default `smollm2-135m`") from None
    return Path(local), spec


def model_dir_problems(path: Path) -> list[str]:
    """What a model directory lacks for training (empty when complete)."""
    problems = []
    if not (path / "config.json").is_file():
        problems.append(f"{path}: no config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        problems.append(f"{path}: no weights (*.safetensors or pytorch_model*.bin)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        problems.append(f"{path}: no tokenizer (tokenizer.json / tokenizer_config.json)")
    return problems


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over the model's *.safetensors files (sorted by name, content only); merge checks runs with it."""
    h = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelError(f"{model_dir}: no *.safetensors weights to hash")
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


TOKENIZER_PROBE = "fn add(a: int, b: int) to int {\n    return a + b  // the sum, done ✓\n}\n"
"""Text encoded by both the loaded tokenizer and its tokenizer.json: code, spaces, a newline, non-ASCII."""


def auto_tokenizer(path: str | Path):
    """`AutoTokenizer`, unless it encodes differently from the directory's tokenizer.json: then that file as written.

    transformers 5 loads a tokenizer.json as the model type's own class (Qwen2Tokenizer for qwen2), rebuilt from
    the file's vocabulary and merges with the class's own pre-tokenizer. A tokenizer of another kind silently
    loses text that way: a word-level tokenizer under a qwen2 config encoded `fn add(a: int, b: int)` as
    `a(a:,b:)`, and every word the model was to learn was gone. One probe text encoded both ways tells."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return tok
    from tokenizers import Tokenizer

    want = Tokenizer.from_file(str(file)).encode(TOKENIZER_PROBE, add_special_tokens=False).ids
    got = tok(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if got == want:
        return tok
    from transformers import PreTrainedTokenizerFast

    exact = PreTrainedTokenizerFast.from_pretrained(str(path))
    if exact(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] != want:
        raise ModelError(f"{file}: neither {type(tok).__name__} nor the file itself loaded through transformers "
                         "encodes text as the file does; re-save the tokenizer with this transformers version")
    warnings.warn(f"{path}: transformers loads this tokenizer as {type(tok).__name__}, which encodes text "
                  f"differently from its tokenizer.json ({len(got)} tokens for {len(want)} on a probe text, e.g. "
                  f"{tok.decode(got)[:40]!r} for {TOKENIZER_PROBE[:40]!r}); using tokenizer.json as written",
                  stacklevel=2)
    return exact


def load_tokenizer(path: str | Path):
    """The model's tokenizer with a chat template (ChatML when it has none) and a pad token."""
    try:
        tok = auto_tokenizer(path)
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{path}: tokenizer does not load ({type(e).__name__}: {e}); the directory needs "
                         "tokenizer.json or tokenizer_config.json") from None
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def load_base(path: str | Path, *, backend: str, device: str):
    """The base causal LM for a backend: NF4 (qlora), bf16 on GPU / f32 on CPU (lora), f32 (full)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mens.model.quant import compute_dtype, keep_trainable_layout, nf4_config

    kwargs: dict = {"dtype": compute_dtype(device) if backend != "full" else torch.float32}
    if backend == "qlora":
        kwargs.update(quantization_config=nf4_config(device), device_map={"": device})
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as e:
        raise ModelError(f"{path}: model does not load for --backend {backend} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300]})") from None
    if backend != "qlora":
        model.to(device)
    else:
        keep_trainable_layout(model)
    model.config.use_cache = False
    return model
