"""`mens merge RUN -o OUT`: fold a run's LoRA adapter into full-precision base weights.

A QLoRA run trained against NF4-quantized base weights, so the base is loaded in 4-bit the same way
and dequantized before merging: the merged weights are then exactly what training saw (W_nf4 + BA),
not the original W + BA. The result is a plain Hugging Face directory that loads without mens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mens.errors import ModelError, UsageError
from mens.merge.handoff import ollama_modelfile, write_handoff
from mens.model.inference import SYSTEM_PROMPT_FILE, resolve_base
from mens.model.load import weights_sha256
from mens.model.quant import nf4_config

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def merge_adapter(run_dir: str | Path, out_dir: str | Path, *, check_sha: bool = True) -> Path:
    """Merge RUN's adapter into its base and write OUT as a Hugging Face model directory."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from mens.model.generate import stop_token_ids

    run, out = Path(run_dir), Path(out_dir)
    missing = [f for f in ADAPTER_FILES if not (run / f).is_file()]
    if missing:
        raise ModelError(f"{run}: no adapter to merge (missing {', '.join(missing)}); full fine-tuning runs "
                         "already hold plain Hugging Face weights")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"target {out} exists and is not empty; choose another -o or remove it first")
    base_dir, manifest = resolve_base(run)
    want_sha = manifest.get("base_weights_sha256")
    if check_sha and want_sha:
        got = weights_sha256(base_dir)
        if got != want_sha:
            raise ModelError(f"base weights in {base_dir} have sha256 {got[:12]}…, but the run was trained on "
                             f"{want_sha[:12]}…; merge against the exact base the run used")
    qlora = manifest.get("backend") == "qlora"
    kwargs: dict = {"dtype": torch.float32}
    if qlora:
        kwargs["quantization_config"] = nf4_config("cpu")  # as the run loaded it; f32 compute on CPU
        kwargs["device_map"] = "cpu"
    base = AutoModelForCausalLM.from_pretrained(base_dir, **kwargs)
    if qlora:
        # NF4 -> float: the weights the adapter was trained against. Must happen before any forward pass:
        # bitsandbytes repacks 4-bit weights for its CPU kernel on first use, after which dequantize is wrong.
        base = base.dequantize()
        base.to(torch.float32)
    model = PeftModel.from_pretrained(base, run).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(run if (run / "tokenizer_config.json").is_file() else base_dir)

    tmp = out.with_name(out.name + ".tmp-merge")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size="2GB")
    tokenizer.save_pretrained(tmp)
    stops = sorted(stop_token_ids(tokenizer, model))
    gen = GenerationConfig(eos_token_id=stops if len(stops) > 1 else stops[0], do_sample=False,
                           pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0],
                           bos_token_id=getattr(model.config, "bos_token_id", None))
    gen.save_pretrained(tmp)
    stop_strings = [tokenizer.convert_ids_to_tokens(i) for i in stops]
    system_prompt = manifest.get("system_prompt")
    modelfile = ollama_modelfile(getattr(tokenizer, "chat_template", None), system_prompt, stop_strings)
    if modelfile:
        (tmp / "Modelfile").write_text(modelfile, encoding="utf-8")
    if system_prompt:  # serve and eval-local use the same prompt as training
        (tmp / SYSTEM_PROMPT_FILE).write_text(system_prompt, encoding="utf-8")
    if out.exists():
        out.rmdir()  # empty: checked above
    tmp.replace(out)
    rank = json.loads((run / "adapter_config.json").read_text(encoding="utf-8")).get("r")
    write_handoff(out, name=run.name, base_model=str(base_dir), run_dir=run, lora_rank=rank,
                  modelfile=modelfile is not None, stops=stop_strings)
    return out
