"""Preflight failures: each says what, where, seen vs expected and what to do; training-preflight.json records them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from train_tiny import tiny_config, vox_rows, write_jsonl

from mens.errors import DataError, ModelError
from mens.train.run import run_training


def _preflight(out):
    return json.loads((out / "training-preflight.json").read_text())


def test_missing_data(tmp_path, tiny_model_dir):
    with pytest.raises(DataError, match="no training file at .*train.jsonl"):
        run_training(tiny_config(tmp_path / "nowhere", tmp_path / "o", tiny_model_dir))


def test_too_few_examples(tmp_path, tiny_model_dir):
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "train.jsonl", vox_rows(3))
    with pytest.raises(DataError, match="3 usable examples of 3 rows.*at least 10"):
        run_training(tiny_config(tmp_path / "d", tmp_path / "o", tiny_model_dir))
    assert _preflight(tmp_path / "o")["passed"] is False


def test_bad_records_are_listed_with_file_and_line(tmp_path, tiny_model_dir):
    d = tmp_path / "d"
    d.mkdir()
    write_jsonl(d / "train.jsonl", vox_rows(12))
    with (d / "train.jsonl").open("a") as f:
        f.write('{"prompt": "only a prompt"}\n{not json\n')
    pattern = r"(?s)2 of 14 lines.*train.jsonl:13: .*response.*train.jsonl:14: malformed JSON"
    with pytest.raises(DataError, match=pattern):
        run_training(tiny_config(d, tmp_path / "o", tiny_model_dir))


def test_model_dir_lacking_files(tmp_path, data_dir, tiny_model_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no weights"):
        run_training(tiny_config(data_dir, tmp_path / "o", broken))
    assert any(c["check"] == "model files" and not c["ok"] for c in _preflight(tmp_path / "o")["checks"])


def test_tokenizer_larger_than_embeddings(tmp_path, data_dir, tiny_model_dir):
    small = tmp_path / "small-vocab"
    shutil.copytree(tiny_model_dir, small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["vocab_size"] = 100
    (small / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="tokenizer has .* tokens but the model's vocab_size is 100"):
        run_training(tiny_config(data_dir, tmp_path / "o", small))


def test_strict_targets_fail_on_an_unadapted_projection(tmp_path, data_dir, tiny_model_dir, monkeypatch):
    """A decoder-layer projection peft cannot wrap: --strict-targets fails naming it; the default warns and trains."""
    from mens.train import run

    class Packed(torch.nn.Module):  # a projection that is not an nn.Linear
        def __init__(self, inner):
            super().__init__()
            self.weight = inner.weight

        def forward(self, x):
            return x @ self.weight.T

    def load_with_packed(*args, **kw):
        model = load_base(*args, **kw)
        model.model.layers[1].mlp.down_proj = Packed(model.model.layers[1].mlp.down_proj)
        return model

    load_base = run.load_base
    monkeypatch.setattr(run, "load_base", load_with_packed)
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.down_proj \(Packed\).*--strict-targets"):
        run_training(tiny_config(data_dir, tmp_path / "o", tiny_model_dir, strict_targets=True))
    assert any(c["check"] == "target modules" and not c["ok"] for c in _preflight(tmp_path / "o")["checks"])
    with pytest.warns(UserWarning, match=r"stay frozen: model\.layers\.1\.mlp\.down_proj"):
        run_training(tiny_config(data_dir, tmp_path / "o2", tiny_model_dir, max_steps=1, save_every=0))
    adapter = json.loads((tmp_path / "o2" / "training_manifest.json").read_text())["adapter"]
    assert adapter["left_out"] == ["model.layers.1.mlp.down_proj (Packed)"] and len(adapter["modules"]) == 13


def test_non_finite_first_loss(tmp_path, data_dir, tiny_model_dir):
    import transformers

    nan_dir = tmp_path / "nan"
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.fill_(float("nan"))
    model.save_pretrained(nan_dir)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / f, nan_dir / f)
    with pytest.raises(ModelError, match="first batch's loss is nan"):
        run_training(tiny_config(data_dir, tmp_path / "o", nan_dir))
    assert not _preflight(tmp_path / "o")["passed"]


def test_existing_run_needs_resume(tmp_path, data_dir, tiny_model_dir):
    run_training(tiny_config(data_dir, tmp_path / "o", tiny_model_dir, max_steps=1, save_every=0))
    from mens.errors import ConfigError

    with pytest.raises(ConfigError, match="already holds a run.*--resume"):
        run_training(tiny_config(data_dir, tmp_path / "o", tiny_model_dir, max_steps=1))


def test_hub_id_offline_is_a_clear_model_error(monkeypatch):
    from mens.model.load import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="could not fetch it from the Hugging Face hub.*Offline"):
        resolve_model("someorg/not-a-cached-model")
    with pytest.raises(ModelError, match="not a model directory, an embedded model"):
        resolve_model("./no/such/dir")


def test_jsonl_file_accepted_and_resume_checks_settings(tmp_path, data_dir, tiny_model_dir):
    from mens.errors import ConfigError

    out = tmp_path / "o"
    run_training(tiny_config(data_dir / "train.jsonl", out, tiny_model_dir, max_steps=4, save_every=2))
    assert json.loads((out / "training_manifest.json").read_text())["data"].endswith("train.jsonl")
    changed = tiny_config(data_dir, out, tiny_model_dir, max_steps=4, save_every=2, learning_rate=0.5, resume=True)
    with pytest.raises(ConfigError, match="--resume: .*differ from .*config.yaml in optimizer.learning_rate"):
        run_training(changed)
    (out / "config.yaml").unlink()  # without the run's config.yaml, the checkpoint's digest still refuses
    with pytest.raises(ConfigError, match="--resume: .*step-2 was written with other settings"):
        run_training(changed)
