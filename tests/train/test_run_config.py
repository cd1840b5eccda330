"""RUN/config.yaml: written before step 0, a run replayed from it ends with a bit-identical adapter, --resume is
checked against it (naming the keys that differ), and --background relaunches from it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors import safe_open

from mens.cli.main import app
from mens.errors import ConfigError, DataError


def _flags(data_dir, out, model_dir, *extra: str) -> list[str]:
    return ["train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model", str(model_dir), "--backend",
            "lora", "--device", "cpu", "--preset", "cpu", "--max-steps", "3", "--seq-len", "96", "--rank", "4",
            "--alpha", "8", "--lora-dropout", "0.1", "--lr", "1e-2", "--min-examples", "10", "--threads", "1",
            "--save-every", "0", "--autocast", "off", "--system-prompt", "You write Vox.", *extra]


def test_a_run_replayed_from_its_config_yaml_ends_bit_identical(data_dir, tmp_path, tiny_model_dir):
    first, replay = tmp_path / "first", tmp_path / "replay"
    # the original's runbook spelling trains too (--tokenizer hf is a no-op with a note)
    assert app(args=_flags(data_dir, first, tiny_model_dir, "--tokenizer", "hf"), standalone_mode=False) == 0
    saved = yaml.safe_load((first / "config.yaml").read_text())
    assert saved["output_dir"] == str(first) and saved["adapter"]["lora_dropout"] == 0.1  # dropout draws: seeded
    assert app(args=["train", str(first / "config.yaml"), f"output_dir={replay}"], standalone_mode=False) == 0
    a, b = (safe_open(str(d / "adapter_model.safetensors"), "pt") for d in (first, replay))
    assert a.metadata() == b.metadata()  # with the sha256 of every tensor's bytes
    assert a.keys() == b.keys() and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    assert {**saved, "output_dir": str(replay)} == yaml.safe_load((replay / "config.yaml").read_text())


def test_config_yaml_is_written_before_preflight(tmp_path, tiny_model_dir):
    out = tmp_path / "o"
    with pytest.raises(DataError):
        app(args=_flags(tmp_path / "no-data", out, tiny_model_dir), standalone_mode=False)
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["path"] == str(tmp_path / "no-data")


def test_resume_refuses_a_changed_setting_by_name_and_allows_a_longer_run(data_dir, tmp_path, tiny_model_dir):
    out = tmp_path / "o"
    run = _flags(data_dir, out, tiny_model_dir)
    assert app(args=[*run, "--max-steps", "4", "--save-every", "2"], standalone_mode=False) == 0
    with pytest.raises(ConfigError, match=r"--resume: the requested settings differ from .*config.yaml in "
                                          r"adapter.lora_dropout, data.seq_len \(adapter.lora_dropout: 0.1 -> 0.2; "
                                          r"data.seq_len: 96 -> 64\)"):
        app(args=[*run, "--max-steps", "4", "--resume", "--lora-dropout", "0.2", "--seq-len", "64"],
            standalone_mode=False)
    with pytest.raises(ConfigError, match="differ .* in adapter.r "):  # refused before detaching, too
        app(args=[*run, "--resume", "--rank", "8", "--background"], standalone_mode=False)
    assert not (out / "logs").exists()
    # how long it runs may change: resumed from step 2's checkpoint, it now runs to step 6
    assert app(args=[*run, "--max-steps", "6", "--save-every", "2", "--resume"], standalone_mode=False) == 0
    assert json.loads((out / "run_summary.json").read_text())["steps"] == 6
    assert yaml.safe_load((out / "config.yaml").read_text())["schedule"]["max_steps"] == 6
