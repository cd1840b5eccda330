"""`mens merge RUN -o OUT`: fold a run's LoRA adapter into full-precision base weights.

A QLoRA run trained against NF4-quantized base weights, so the base is loaded in 4-bit the same way
and dequantized before merging: the merged weights are then exactly what training saw (W_nf4 + BA),
not the original W + BA. A full fine-tuning run has no adapter: its weights are exported as they are, with
the same serving files. The result is a plain Hugging Face directory that loads without mens.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mens.errors import ModelError, UsageError
from mens.merge.handoff import chat_template_family, ollama_modelfile, write_handoff
from mens.model.chat_template import save_tokenizer
from mens.model.inference import resolve_base
from mens.model.load import weights_sha256
from mens.model.lora import ADAPTER_FILES, load_adapter
from mens.model.quant import nf4_config
from mens.run_records import ADAPTER_CONFIG, MANIFEST, SYSTEM_PROMPT, TrainingManifest, read_json


def merge_adapter(run_dir: str | Path, out_dir: str | Path, *, check_sha: bool = True) -> Path:
    """Merge RUN's adapter into its base (or export a full fine-tune) and write OUT as a Hugging Face model dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from mens.model.generate import stop_token_ids

    run, out = Path(run_dir), Path(out_dir)
    full_manifest = _full_run_manifest(run)
    full = full_manifest is not None
    missing = [f for f in ADAPTER_FILES if not (run / f).is_file()]
    if missing and not full:
        raise ModelError(f"{run}: no adapter to merge (missing {', '.join(missing)}) and no full fine-tuned "
                         f"weights (model*.safetensors with backend 'full' in {MANIFEST}); pass a run "
                         "directory written by `mens train`")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"target {out} exists and is not empty; choose another -o or remove it first")
    if full:  # the run's own weights are the model: exported as they are, with the same serving files
        manifest, base_dir = full_manifest, run
        model = AutoModelForCausalLM.from_pretrained(run, dtype=torch.float32)
        base_model, adapter_dir, rank = str(manifest.base_model or run), None, None
    else:
        base_dir, manifest = resolve_base(run)
        model = _merged_adapter_model(run, base_dir, manifest, check_sha)
        base_model, adapter_dir = str(base_dir), run
        adapter_cfg = read_json(run / ADAPTER_CONFIG)
        rank = adapter_cfg.get("r") if isinstance(adapter_cfg, dict) else None
    tokenizer = AutoTokenizer.from_pretrained(run if (run / "tokenizer_config.json").is_file() else base_dir)

    tmp = out.with_name(out.name + ".tmp-merge")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size="2GB")
    save_tokenizer(tokenizer, tmp, manifest.system_prompt)  # the trained prompt is the default
    stops = sorted(stop_token_ids(tokenizer, model))
    gen = GenerationConfig(eos_token_id=stops if len(stops) > 1 else stops[0], do_sample=False,
                           pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0],
                           bos_token_id=getattr(model.config, "bos_token_id", None))
    gen.save_pretrained(tmp)
    stop_strings = [tokenizer.convert_ids_to_tokens(i) for i in stops]
    system_prompt = manifest.system_prompt
    modelfile = ollama_modelfile(getattr(tokenizer, "chat_template", None), system_prompt, stop_strings)
    if modelfile:
        (tmp / "Modelfile").write_text(modelfile, encoding="utf-8")
    if system_prompt:  # serve and eval-local use the same prompt as training
        (tmp / SYSTEM_PROMPT).write_text(system_prompt, encoding="utf-8")
    if out.exists():
        out.rmdir()  # empty: checked above
    tmp.replace(out)
    write_handoff(out, name=run.name, base_model=base_model, run_dir=adapter_dir, lora_rank=rank,
                  modelfile=modelfile is not None, stops=stop_strings,
                  family=chat_template_family(getattr(tokenizer, "chat_template", None))[0])
    return out


def _full_run_manifest(run: Path) -> TrainingManifest | None:
    """The manifest of a full fine-tuning run (backend "full", its own weights beside it), else None; a manifest
    mens cannot read is a DataError (an adapter run's would fail in resolve_base the same way)."""
    if not any(run.glob("model*.safetensors")):
        return None
    manifest = TrainingManifest.read_optional(run / MANIFEST)
    return manifest if manifest is not None and manifest.backend == "full" else None


def _merged_adapter_model(run: Path, base_dir: Path, manifest: TrainingManifest, check_sha: bool):
    """The base (dequantized NF4 for QLoRA runs) with the run's adapter folded in, in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    want_sha = manifest.base_weights_sha256
    if check_sha and want_sha:
        got = weights_sha256(base_dir)
        if got != want_sha:
            raise ModelError(f"base weights in {base_dir} have sha256 {got[:12]}…, but the run was trained on "
                             f"{want_sha[:12]}…; merge against the exact base the run used")
    qlora = manifest.backend == "qlora"
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
    return load_adapter(base, run).merge_and_unload()
