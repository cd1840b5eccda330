"""`external_serving_handoff_v1.json` (the original's schema), `serving.json` (ready commands and stop strings) and
an Ollama Modelfile whose template and stops match training."""

from __future__ import annotations

from pathlib import Path

from mens.run_records import HANDOFF, SERVING, write_json

HANDOFF_SCHEMA = "vox_external_serving_handoff_v1"
"""The original's hand-off id (its JSON schema fixes it), not a mens record id."""

# Ollama's TEMPLATE is a Go template, not the tokenizer's Jinja, so each chat format is written out once here, for
# the families whose Jinja template is fixed text (the others differ from model to model and are refused). Ollama
# hands a system message to the template twice: as .System (the caller's, else the Modelfile's SYSTEM) and inside
# .Messages; each template writes it once, from .System, and skips the system entries of .Messages.
_TEMPLATES = {
    # ChatML (SmolLM2, Qwen): a system turn, then every turn as <|im_start|>role ... <|im_end|>.
    "chatml": (
        "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "{{- range .Messages }}{{- if ne .Role \"system\" }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
        "{{ end }}{{- end }}<|im_start|>assistant\n"
    ),
    # Llama 3: header-delimited turns ending in <|eot_id|>; llama.cpp adds the BOS token itself.
    "llama3": (
        "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
        "{{- range .Messages }}{{- if ne .Role \"system\" }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n"
        "{{ .Content }}<|eot_id|>{{ end }}{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    # Gemma 3: no system turn; the system prompt opens the first user turn, and the assistant's role is "model".
    "gemma": (
        "{{- $first := true }}{{- range .Messages }}{{- if ne .Role \"system\" }}<start_of_turn>"
        "{{ if eq .Role \"assistant\" }}model{{ else }}{{ .Role }}{{ end }}\n"
        "{{ if and $first $.System }}{{ $.System }}\n\n{{ end }}{{ .Content }}<end_of_turn>\n"
        "{{ $first = false }}{{ end }}{{- end }}<start_of_turn>model\n"
    ),
}
_END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "gemma": "<end_of_turn>"}
PROMPT_FORMATS = {"chatml": "chatml_im_start", "llama3": "llama3_header_eot", "gemma": "gemma_start_of_turn"}
"""The hand-off's `prompt_format` for each family; any other template is "tokenizer_chat_template"."""


def chat_template_family(chat_template: str | None) -> tuple[str | None, str]:
    """(family, why): the Ollama template family of a tokenizer's Jinja chat template, or None and the reason."""
    if not chat_template:
        return None, "the tokenizer has no chat template"
    if "<|im_start|>" in chat_template:
        return "chatml", "ChatML"
    if "<|start_header_id|>" in chat_template:
        if "Cutting Knowledge Date" in chat_template:  # Llama 3.1+: a dated system header that varies by day
            return None, ("the Llama 3.1+ template writes knowledge and today's date into the system turn, "
                          "which a fixed Ollama template cannot reproduce")
        return "llama3", "Llama 3"
    if "<start_of_turn>" in chat_template:
        if "first_user_prefix" not in chat_template:  # Gemma 1/2 refuse a system turn instead of merging it
            return None, "this Gemma template has no system prompt (only Gemma 3's merges it into the first turn)"
        return "gemma", "Gemma 3"
    if "[INST]" in chat_template:
        return None, "Mistral's [INST] templates differ between versions (spaces, where the system prompt goes)"
    return None, "the chat template is not ChatML, Llama 3 or Gemma 3"


def ollama_modelfile(chat_template: str | None, system_prompt: str | None, stops: list[str], *,
                     source: str = ".") -> str | None:
    """A Modelfile `FROM source` (the merged directory, or a GGUF file beside it) with the template family of
    `chat_template` and the trained system prompt as SYSTEM, or None when the family is not one Ollama's template
    can reproduce (see `chat_template_family`; set TEMPLATE by hand)."""
    family, _ = chat_template_family(chat_template)
    if family is None:
        return None
    lines = [f"FROM {source}", f'TEMPLATE """{_TEMPLATES[family]}"""']
    if system_prompt:
        lines.append(f'SYSTEM """{system_prompt.strip()}"""')
    stops = list(dict.fromkeys([*stops, _END_OF_TURN[family]]))
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines.append("PARAMETER temperature 0")
    return "\n".join(lines) + "\n"


def write_handoff(out: Path, *, name: str, base_model: str, run_dir: Path | None, lora_rank: int | None,
                  modelfile: bool, stops: list[str], family: str | None = None) -> Path:
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
        "prompt_format": PROMPT_FORMATS.get(family or "", "tokenizer_chat_template"),
        "notes": "The merged directory loads with plain transformers; its chat template adds the training system "
                 f"prompt when a request has none. Ready commands and stop strings: {out / SERVING}.",
    }
    path = write_json(out / HANDOFF, doc)
    write_json(out / SERVING, {"name": name, "stop": stops, "commands": commands})
    return path


def write_gguf_handoff(out: Path, *, name: str, gguf: Path, base_model: str, modelfile: bool, stops: list[str],
                       family: str | None) -> Path:
    """The hand-off and ready commands of a GGUF export (llama.cpp, llama-cpp-python, Ollama), absolute paths."""
    out, gguf = Path(out).resolve(), Path(gguf).resolve()
    if Path(base_model).exists():
        base_model = str(Path(base_model).resolve())
    # --jinja: llama.cpp renders the GGUF's own chat template, which carries the trained system prompt as its
    # default; without it llama.cpp guesses a built-in format and sends no system prompt.
    commands = {"llama_server": f"llama-server -m {gguf} --jinja --temp 0",
                "llama_cli": f"llama-cli -m {gguf} --jinja -cnv --temp 0",
                "llama_cpp_python": f"Llama({str(gguf)!r}).create_chat_completion(messages=[...], temperature=0)"}
    if modelfile:
        commands["ollama"] = f"cd {out} && ollama create {name} -f Modelfile && ollama run {name}"
    doc = {
        "schema": HANDOFF_SCHEMA,
        "schema_version": 1,
        "backend_family": "ollama" if modelfile else "other",
        "base_model": base_model,
        "artifact_dir": str(out),
        "adapter_path": None,
        "tokenizer_source": str(gguf),
        "prompt_format": PROMPT_FORMATS.get(family or "", "tokenizer_chat_template"),
        "notes": "A GGUF file for llama.cpp and Ollama; its chat template adds the training system prompt when a "
                 f"request has none (llama.cpp: pass --jinja). Ready commands and stop strings: {out / SERVING}.",
    }
    path = write_json(out / HANDOFF, doc)
    write_json(out / SERVING, {"name": name, "gguf": str(gguf), "stop": stops, "commands": commands})
    return path
