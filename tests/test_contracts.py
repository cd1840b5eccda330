"""The files the original defines validate against its JSON schemas (../shared/.../mens-reference/contracts/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

CONTRACTS = Path(__file__).resolve().parents[2] / "shared/corpus/vox/mens-reference/contracts"


def _schema(name: str) -> dict:
    path = CONTRACTS / name
    if not path.is_file():
        pytest.skip(f"the original's contracts are not at {CONTRACTS}")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("backend", ["lora", "full"])
def test_merge_handoff_validates_against_the_original_schema(tmp_path, make_tiny_run, backend):
    from mens.merge.merge import merge_adapter

    schema = _schema("external-serving-handoff.schema.json")
    _, run, _ = make_tiny_run("lora")
    if backend == "full":  # a full fine-tune exports its own weights: no adapter_path
        manifest = json.loads((run / "training_manifest.json").read_text())
        manifest.update(backend="full", base_model="tiny-base")
        import transformers

        transformers.AutoModelForCausalLM.from_pretrained(manifest["base_model_path"]).save_pretrained(run)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            (run / f).unlink()
        (run / "training_manifest.json").write_text(json.dumps(manifest))
    out = merge_adapter(run, tmp_path / "merged")
    doc = json.loads((out / "external_serving_handoff_v1.json").read_text())
    jsonschema.validate(doc, schema)
    assert (out / "serving.json").is_file()


@pytest.mark.parametrize("failed_early", [False, True])
def test_preflight_file_validates_against_the_original_schema(tmp_path, failed_early):
    from mens.errors import DataError
    from mens.run_records import PREFLIGHT
    from mens.train.preflight import Preflight

    schema = _schema("training-preflight.schema.json")
    pf = Preflight(tmp_path, write=True)
    pf.ok("data file", "train.jsonl")
    if failed_early:  # a check failed before the contract digest was computed
        with pytest.raises(DataError):
            pf.fail("model", DataError("no such model"))
    else:
        pf.contract_digest = "abc123"
        pf.write()
    jsonschema.validate(json.loads((tmp_path / PREFLIGHT).read_text()), schema)
