"""Merge parity: merged weights loaded with plain transformers give the logits of base + adapter."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from mens.errors import ModelError, UsageError  # noqa: E402
from mens.merge.merge import merge_adapter  # noqa: E402


# bitsandbytes' CPU 4-bit matmul runs in bf16 (its quant state is bf16), so a QLoRA run agrees with its
# f32 dequantized merge to bf16 precision only; LoRA on an f32 base agrees to f32 precision.
@pytest.mark.parametrize(("backend", "atol"), [("lora", 1e-5), ("qlora", 5e-3)])
def test_merged_dir_matches_base_plus_adapter(tmp_path, make_tiny_run, backend, atol):
    model, run, base_dir = make_tiny_run(backend)
    ids = torch.tensor([[1, 5, 9, 20, 33, 7]])
    with torch.no_grad():
        want = model(ids).logits
        base_only = transformers.AutoModelForCausalLM.from_pretrained(base_dir)(ids).logits
    assert (want - base_only).abs().max() > 1e-3  # the adapter matters
    out = merge_adapter(run, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        got = merged(ids).logits
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja",
            "external_serving_handoff_v1.json", "Modelfile"} <= names
    gen = json.loads((out / "generation_config.json").read_text())
    im_end = transformers.AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<|im_end|>")
    assert im_end in (gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])
    modelfile = (out / "Modelfile").read_text()
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "You write Vox." in modelfile
    handoff = json.loads((out / "external_serving_handoff_v1.json").read_text())
    assert handoff["schema"] == "vox_external_serving_handoff_v1"
    assert "--enable-lora" in json.loads((out / "serving.json").read_text())["commands"]["vllm_base_plus_lora"]


def test_merge_refuses_bad_inputs(tmp_path, make_tiny_run):
    _, run, base_dir = make_tiny_run("lora")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    with pytest.raises(UsageError, match="exists"):
        merge_adapter(run, tmp_path / "taken")
    assert (tmp_path / "taken" / "x").read_text() == "keep me"
    manifest = json.loads((run / "training_manifest.json").read_text())
    manifest["base_weights_sha256"] = "0" * 64
    (run / "training_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="sha256"):
        merge_adapter(run, tmp_path / "m2")
    (run / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelError, match="no adapter"):
        merge_adapter(run, tmp_path / "m3")


def test_full_finetune_run_exports_its_own_weights(tmp_path, make_tiny_run):
    """A full fine-tune has no adapter: merge exports the run's weights with the same serving files."""
    model, adapter_run, base_dir = make_tiny_run("lora")
    run = tmp_path / "full-run"
    trained = model.merge_and_unload()  # stands in for weights a full fine-tune changed
    trained.save_pretrained(run)
    transformers.AutoTokenizer.from_pretrained(adapter_run).save_pretrained(run)
    (run / "training_manifest.json").write_text(json.dumps(
        {"backend": "full", "base_model": "tiny-base", "system_prompt": "You write Vox."}))
    ids = torch.tensor([[1, 5, 9, 20, 33, 7]])
    with torch.no_grad():
        want = trained(ids).logits
    out = merge_adapter(run, tmp_path / "merged")
    with torch.no_grad():
        got = transformers.AutoModelForCausalLM.from_pretrained(out)(ids).logits
    assert torch.equal(got, want)
    assert "You write Vox." in (out / "Modelfile").read_text()
    handoff = json.loads((out / "external_serving_handoff_v1.json").read_text())
    assert handoff["adapter_path"] is None
    assert "vllm_base_plus_lora" not in json.loads((out / "serving.json").read_text())["commands"]
    assert handoff["base_model"] == "tiny-base"
    (run / "training_manifest.json").write_text(json.dumps({"backend": "lora"}))  # weights, but not a full run
    with pytest.raises(ModelError, match="no adapter"):
        merge_adapter(run, tmp_path / "m2")


def test_merged_model_without_a_system_message_prompts_and_answers_as_mens_eval(tmp_path, make_tiny_run):
    """Plain transformers on the merged dir, no system message: the prompt mens trained and evaluated with, token
    for token, and the greedy answer of the run (base + adapter) that eval-local scores."""
    from mens.model.generate import chat_input_ids

    model, run, _ = make_tiny_run("lora")
    out = merge_adapter(run, tmp_path / "merged")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    run_tok = transformers.AutoTokenizer.from_pretrained(run)
    for task in ("Write a Vox fn that adds one.", "Declare a table of users."):
        user = [{"role": "user", "content": task}]
        mens_ids = chat_input_ids(run_tok, user, "You write Vox.")  # what eval-local and serve send
        plain = tok.apply_chat_template(user, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert plain == mens_ids
        kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            want = model.generate(input_ids=torch.tensor([mens_ids]), **kw)
            got = merged.generate(torch.tensor([plain]), **kw)
        assert got.tolist() == want.tolist()


def test_handoff_commands_use_absolute_paths_and_the_modelfile_writes_the_system_turn_once(tmp_path, make_tiny_run,
                                                                                          monkeypatch):
    _, run, _ = make_tiny_run("lora")
    monkeypatch.chdir(tmp_path)
    out = merge_adapter(run.relative_to(tmp_path), "merged")  # relative paths, as a user types them
    commands = json.loads((tmp_path / "merged" / "serving.json").read_text())["commands"]
    for key in ("vllm_merged", "vllm_base_plus_lora", "ollama"):
        assert str(tmp_path / "merged") in commands[key] or str(tmp_path / "run") in commands[key], commands[key]
    assert f"--lora-modules run={tmp_path / 'run'}" in commands["vllm_base_plus_lora"]
    template = (tmp_path / out / "Modelfile").read_text().split('TEMPLATE """')[1].split('"""')[0]
    # .System carries the caller's system message (else SYSTEM); .Messages holds it too and must not repeat it
    assert template.count("{{ .System }}") == 1 and 'if ne .Role "system"' in template
