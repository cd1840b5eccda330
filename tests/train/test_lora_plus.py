"""LoRA+: the adapters' B matrices in their own optimizer group at ratio x the learning rate, A at the rate."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.errors import ConfigError
from mens.model.load import load_base
from mens.model.lora import attach_lora
from mens.train.run import param_groups, run_training
from mens.train.telemetry import read_events


def test_groups_split_b_from_the_rest(tiny_model_dir):
    model = attach_lora(load_base(tiny_model_dir, backend="lora", device="cpu"), r=4, alpha=8, dropout=0.0)
    names = {id(p): n for n, p in model.named_parameters()}
    plain = param_groups(model, 1e-3, 1.0)
    assert len(plain) == 1 and plain[0]["lr"] == 1e-3
    rest, b = param_groups(model, 1e-3, 16.0)
    assert rest["lr"] == 1e-3 and b["lr"] == pytest.approx(1.6e-2)
    assert b["params"] and all(".lora_B." in names[id(p)] for p in b["params"])
    assert rest["params"] and all(".lora_A." in names[id(p)] for p in rest["params"])
    assert len(rest["params"]) + len(b["params"]) == len(plain[0]["params"])


def test_no_b_matrices_is_a_clear_error(tiny_model_dir):
    model = load_base(tiny_model_dir, backend="lora", device="cpu")
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(True)
    with pytest.raises(ConfigError, match="lora_plus_ratio"):
        param_groups(model, 1e-3, 4.0)


def test_a_run_with_lora_plus_moves_b_further_and_records_it(data_dir, tmp_path, tiny_model_dir):
    plain, plus = tmp_path / "plain", tmp_path / "plus"
    run_training(tiny_config(data_dir, plain, tiny_model_dir, save_every=0, max_steps=3))
    run_training(tiny_config(data_dir, plus, tiny_model_dir, save_every=0, max_steps=3, lora_plus_ratio=16.0))
    a, b = load_file(str(plain / "adapter_model.safetensors")), load_file(str(plus / "adapter_model.safetensors"))

    def norm(w, part):
        return sum(w[k].float().norm().item() for k in w if part in k)

    # B starts at zero in both runs; with 16x its rate Adam moves it ~16x as far in the same steps
    assert norm(b, "lora_B") > 4 * norm(a, "lora_B")
    assert norm(a, "lora_A") > 0 and norm(b, "lora_A") > 0
    man = json.loads((plus / "training_manifest.json").read_text())
    assert man["config"]["lora_plus_ratio"] == 16.0
    checks = json.loads((plus / "training-preflight.json").read_text())["checks"]
    assert any(c["check"] == "optimizer" and "16x" in c["detail"] for c in checks)


def test_resume_restores_both_groups(data_dir, tmp_path, tiny_model_dir):
    """A run resumed from its step-3 checkpoint ends where the uninterrupted run did: the B group's own rate and
    Adam state come back from the checkpoint."""
    import shutil

    over = dict(save_every=3, max_steps=6, lora_plus_ratio=8.0, learning_rate=3e-3, warmup_steps=2)
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    run_training(tiny_config(data_dir, ref, tiny_model_dir, **over))
    shutil.copytree(ref, cut)
    shutil.rmtree(cut / "checkpoints" / "step-6", ignore_errors=True)
    (cut / "adapter_model.safetensors").unlink()
    run_training(tiny_config(data_dir, cut, tiny_model_dir, **over, resume=True))
    starts = [e["resumed_from_step"] for e in read_events(cut) if e["event"] == "train_start"]
    assert starts == [None, 3]
    a, b = load_file(str(ref / "adapter_model.safetensors")), load_file(str(cut / "adapter_model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
