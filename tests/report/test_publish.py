"""`mens publish`: the dry-run folder is exactly what is uploaded, its card passes huggingface_hub's offline checks,
its usage code runs, and an upload without a token is a clear error."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from mens.cli import main as cli_main
from mens.report.publish import card_problems, publish, stage_folder

torch = pytest.importorskip("torch")

ADAPTER_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors", "benchmark_results.json",
                 "chat_template.jinja", "gate_receipt.json", "plots/loss.png", "plots/modes.png",
                 "plots/throughput.png", "system_prompt.txt", "tokenizer.json", "tokenizer_config.json",
                 "training_config.json"}  # one bench category: no per-category plots (plots/modes.png shows it)


def _mens(*args: str) -> int:
    with pytest.raises(SystemExit) as info:
        cli_main.main(list(args))
    return info.value.code


def _with_base_card(base_dir, license_yaml: str = "license: mit") -> None:
    """Give the tiny base what a downloaded Hub model has: a card with a licence and its id in config.json."""
    (base_dir / "README.md").write_text(f"---\n{license_yaml}\n---\n# tiny base\n")
    cfg = json.loads((base_dir / "config.json").read_text())
    cfg["_name_or_path"] = "someone/tiny-base"
    (base_dir / "config.json").write_text(json.dumps(cfg))


def _code_block(readme: str, heading: str) -> str:
    section = readme.split(f"### {heading}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_dry_run_writes_the_adapter_folder_with_a_hub_valid_card(tmp_path, finished_run, capsys):
    from huggingface_hub import EvalResult, ModelCard
    from huggingface_hub.repocard_data import eval_results_to_model_index

    run, base_dir = finished_run
    _with_base_card(base_dir)
    out = tmp_path / "upload"
    assert _mens("publish", str(run), "--repo-id", "someone/vox-tiny", "--dry-run", str(out)) == 0
    assert "nothing uploaded" in capsys.readouterr().out
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == ADAPTER_FILES

    # What huggingface_hub checks offline: the YAML parses into ModelCardData with metadata errors raised, the
    # model-index converts to EvalResults and back unchanged; plus Hub ids where the Hub wants ids.
    card = ModelCard.load(out / "README.md", ignore_metadata_errors=False)
    assert card_problems(out / "README.md") == []
    meta = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert card.data.base_model == "someone/tiny-base" and card.data.license == "mit"
    assert card.data.library_name == "peft" and meta["base_model_relation"] == "adapter"
    assert all(isinstance(r, EvalResult) for r in card.data.eval_results)
    assert eval_results_to_model_index(card.data.model_name, card.data.eval_results) == meta["model-index"]
    got = {(r.metric_type, r.metric_config): r.metric_value for r in card.data.eval_results}
    assert got == {("nonempty_parse_rate", "greedy"): 0.75, ("pass@1", "greedy"): 0.5,
                   ("nonempty_parse_rate", "constrained"): 1.0, ("pass@1", "constrained"): 0.5}
    # peft and vLLM find the base by its Hub id; no local path of this machine travels anywhere in the folder.
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "someone/tiny-base"
    for name in ("README.md", "benchmark_results.json", "training_config.json", "adapter_config.json"):
        assert str(tmp_path) not in (out / name).read_text(), name
    text = card.text
    for usage in ("### peft", "### vLLM", "### Ollama", "### llama.cpp", "mens export RUN --gguf",
                  "--lora-modules vox-tiny=someone/vox-tiny", "![Training and validation loss](plots/loss.png)"):
        assert usage in text, usage
    assert "| tuned (greedy) | 4 | 0.75 (3/4) | 0.50 (2/4) |" in text


def test_dry_run_of_merged_weights_runs_its_own_transformers_snippet(tmp_path, finished_run, capsys):
    from mens.merge.merge import merge_adapter

    run, _ = finished_run
    merged = merge_adapter(run, tmp_path / "merged")
    out = tmp_path / "upload"
    files = stage_folder(merged, out, repo_id="someone/vox-tiny-merged")  # the run is found through the hand-off
    assert {"config.json", "model.safetensors", "generation_config.json", "Modelfile", "benchmark_results.json",
            "README.md", "plots/modes.png"} <= set(files)
    assert not {"adapter_config.json", "adapter_model.safetensors", "serving.json"} & set(files)
    readme = (out / "README.md").read_text()
    assert card_problems(out / "README.md") == []
    meta = yaml.safe_load(readme.split("---")[1])
    assert meta["library_name"] == "transformers" and meta["license"] == "other" and "base_model" not in meta
    assert "no Hub id" in readme and "licence could not be read" in readme
    # The card's transformers code, pointed at the folder, loads it and answers as mens does (greedy).
    assert _run_snippet(readme, "transformers", "someone/vox-tiny-merged", out, capsys) == _mens_greedy(out, readme)


def _run_snippet(readme: str, heading: str, repo_id: str, folder, capsys, new_tokens: int = 12):
    """Run the card's Python usage code with the repo id pointed at the local folder: (what it printed, the token ids
    it generated)."""
    code = _code_block(readme, heading).replace(repo_id, str(folder))
    capsys.readouterr()
    scope: dict = {}
    exec(compile(code.replace("max_new_tokens=256", f"max_new_tokens={new_tokens}"), "card", "exec"), scope)  # noqa: S102
    from mens.model.generate import stop_token_ids

    new_ids = scope["out"][0, scope["inputs"]["input_ids"].shape[1]:].tolist()
    if new_ids and new_ids[-1] in stop_token_ids(scope["tok"], scope["model"]):
        new_ids.pop()  # generate keeps the stop token it ended on; mens does not
    return capsys.readouterr().out.removesuffix("\n"), new_ids


def _mens_greedy(model_dir, readme: str, new_tokens: int = 12):
    """mens's own greedy answer to the card's example request: (text, token ids)."""
    from mens.model.generate import chat_input_ids, stream_tokens
    from mens.model.inference import load_for_inference

    loaded = load_for_inference(model_dir, device="cpu")
    request = json.loads(re.search(r"messages = (\[.*\])", readme).group(1))[-1]["content"]
    ids = chat_input_ids(loaded.tokenizer, [{"role": "user", "content": request}], loaded.system_prompt)
    kept: list[int] = []
    text = "".join(stream_tokens(loaded.model, loaded.tokenizer, ids, max_new_tokens=new_tokens, on_token=kept.append))
    assert len(kept) >= 4, "the comparison needs a real answer"
    return text, kept


def test_adapter_card_peft_snippet_answers_as_mens_does(tmp_path, finished_run, capsys):
    run, _ = finished_run
    out = tmp_path / "upload"
    stage_folder(run, out, repo_id="someone/vox-tiny")
    readme = (out / "README.md").read_text()
    assert "AutoPeftModelForCausalLM" in _code_block(readme, "peft (and transformers)")
    assert _run_snippet(readme, "peft (and transformers)", "someone/vox-tiny", out, capsys) == _mens_greedy(run, readme)


def test_publish_without_a_token_is_a_clear_error(tmp_path, finished_run, monkeypatch, capsys):
    import huggingface_hub.constants as hub_constants

    run, _ = finished_run
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hub_constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hub_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    assert _mens("publish", str(run), "--repo-id", "someone/vox-tiny") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no Hugging Face token") and "--dry-run" in err and "\n" not in err


def test_publish_uploads_exactly_the_dry_run_folder(tmp_path, finished_run, monkeypatch):
    import huggingface_hub

    run, _ = finished_run
    calls = {}

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls["create"] = (repo_id, kwargs)
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, *, folder_path, repo_id, **kwargs):
            calls["files"] = {p.relative_to(folder_path).as_posix() for p in folder_path.rglob("*") if p.is_file()}
            calls["readme"] = (folder_path / "README.md").read_text()

    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    url = publish(run, "someone/vox-tiny", private=True, log=lambda _: None)
    assert url == "https://huggingface.co/someone/vox-tiny"
    assert calls["create"] == ("someone/vox-tiny", {"private": True, "exist_ok": True, "repo_type": "model"})
    dry = stage_folder(run, tmp_path / "dry", repo_id="someone/vox-tiny")
    assert calls["files"] == set(dry) == ADAPTER_FILES
    assert calls["readme"] == (tmp_path / "dry" / "README.md").read_text()


def test_publish_refuses_bad_input(tmp_path, finished_run, capsys):
    run, _ = finished_run
    assert _mens("publish", str(run), "--repo-id", "not a repo", "--dry-run", str(tmp_path / "x")) == 2
    assert "--repo-id 'not a repo'" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    assert _mens("publish", str(run), "--repo-id", "a/b", "--dry-run", str(tmp_path / "full")) == 2
    assert "not an empty directory" in capsys.readouterr().err and (tmp_path / "full" / "keep").read_text() == "mine"
    assert _mens("publish", str(tmp_path), "--repo-id", "a/b", "--dry-run", str(tmp_path / "y")) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert _mens("publish", str(run), "--repo-id", "a/b", "--gguf", str(tmp_path), "--dry-run",
                 str(tmp_path / "z")) == 2
    assert "no .gguf file" in capsys.readouterr().err


def test_a_gguf_export_travels_with_its_modelfile(tmp_path, finished_run):
    from mens.merge.merge import merge_adapter

    run, _ = finished_run
    merged = merge_adapter(run, tmp_path / "merged")
    export = tmp_path / "export"
    export.mkdir()
    (export / "run-q8_0.gguf").write_bytes(b"GGUF")  # the folder step copies it; llama.cpp tests live in merge/
    (export / "Modelfile").write_text("FROM ./run-q8_0.gguf\n")
    files = stage_folder(merged, tmp_path / "up", repo_id="someone/vox-gguf", gguf=export)
    assert "run-q8_0.gguf" in files and (tmp_path / "up" / "Modelfile").read_text() == "FROM ./run-q8_0.gguf\n"
    readme = (tmp_path / "up" / "README.md").read_text()
    assert "ollama run hf.co/someone/vox-gguf" in readme and "llama-cli -m vox-gguf/run-q8_0.gguf" in readme
    assert "gguf" in yaml.safe_load(readme.split("---")[1])["tags"]


def test_an_unreachable_hub_is_one_clear_line(finished_run, monkeypatch):
    import huggingface_hub

    from mens.errors import UsageError

    class DownApi:
        def create_repo(self, repo_id, **kwargs):
            raise ConnectionError("[Errno -2] Name or service not known")

    run, _ = finished_run
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub, "HfApi", DownApi)
    with pytest.raises(UsageError, match=r"could not upload to the Hub \(ConnectionError: \[Errno -2\]"):
        publish(run, "someone/vox-tiny", log=lambda _: None)
