"""`external_serving_handoff_v1.json` (the original's schema), `serving.json` (ready commands and stop strings) and
an Ollama Modelfile whose template and stops match training."""

from __future__ import annotations

import json
from pathlib import Path

HANDOFF_SCHEMA = "vox_external_serving_handoff_v1"
HANDOFF_FILE = "external_serving_handoff_v1.json"
SERVING_FILE = "serving.json"

# Ollama hands a system message to the template twice: as .System (the caller's, else the Modelfile's SYSTEM) and
# inside .Messages. The system turn is written once, from .System, and system entries of .Messages are skipped.
_CHATML_TEMPLATE = (
    "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}{{- if ne .Role \"system\" }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}{{- end }}<|im_start|>assistant\n"
)


def ollama_modelfile(chat_template: str | None, system_prompt: str | None, stops: list[str]) -> str | None:
    """A Modelfile for the merged directory, or None when the chat template is not ChatML (set it by hand)."""
    if not chat_template or "<|im_start|>" not in chat_template:
        return None
    lines = ["FROM .", f'TEMPLATE """{_CHATML_TEMPLATE}"""']
    if system_prompt:
        lines.append(f'SYSTEM """{system_prompt.strip()}"""')
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines.append("PARAMETER temperature 0")
    return "\n".join(lines) + "\n"


def write_handoff(out: Path, *, name: str, base_model: str, run_dir: Path | None, lora_rank: int | None,
                  modelfile: bool, stops: list[str]) -> Path:
    """Ready commands for vLLM (merged dir; base + LoRA when the run has an adapter) and Ollama, next to the
    merged model. `run_dir` None: a full fine-tune, nothing to serve beside the merged directory."""
    out = Path(out).resolve()  # the commands work from any directory, not only where merge ran
    run_dir = None if run_dir is None else Path(run_dir).resolve()
    if Path(base_model).exists():  # a local base directory (a hub id stays as it is)
        base_model = str(Path(base_model).resolve())
    commands = {"vllm_merged": f"vllm serve {out} --served-model-name {name}"}
    if run_dir is not None:
        commands["vllm_base_plus_lora"] = (f"vllm serve {base_model} --enable-lora --lora-modules {name}={run_dir}"
                                           + (f" --max-lora-rank {lora_rank}" if lora_rank else ""))
    commands["transformers"] = f"AutoModelForCausalLM.from_pretrained({str(out)!r})"
    if modelfile:
        commands["ollama"] = f"cd {out} && ollama create {name} -f Modelfile && ollama run {name}"
    # The hand-off keeps the original's schema exactly (no extra keys: its JSON schema forbids them); the ready
    # commands and stop strings go to serving.json beside it.
    doc = {
        "schema": HANDOFF_SCHEMA,
        "schema_version": 1,
        "backend_family": "vllm",
        "base_model": base_model,
        "artifact_dir": str(out),
        "adapter_path": None if run_dir is None else str(run_dir),
        "tokenizer_source": str(out / "tokenizer.json"),
        "prompt_format": "chatml_im_start" if modelfile else "tokenizer_chat_template",
        "notes": "The merged directory loads with plain transformers; its chat template adds the training system "
                 f"prompt when a request has none. Ready commands and stop strings: {out / SERVING_FILE}.",
    }
    path = out / HANDOFF_FILE
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    serving = {"name": name, "stop": stops, "commands": commands}
    (out / SERVING_FILE).write_text(json.dumps(serving, indent=2) + "\n", encoding="utf-8")
    return path
