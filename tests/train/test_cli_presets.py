"""Presets load and resolve (defaults < preset < flags); CLI help; no torch at `mens --help`; probe; status."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mens.errors import ConfigError
from mens.train.config import TrainConfig
from mens.train.presets import canonical_name, load_preset, preset_names, recommend_preset
from mens.train.resolve import resolve_config


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_into_a_valid_config(name):
    cfg = resolve_config(flags={"data": "d", "output_dir": "o", "preset": name})
    assert isinstance(cfg, TrainConfig) and cfg.seq_len > 0 and cfg.preset == canonical_name(name)


def test_original_names_and_aliases():
    assert canonical_name("4080") == "qwen_4080_16g" and canonical_name("safe") == "4080_safe"
    for name in ("qwen_4080_16g", "4080_safe", "balanced", "throughput", "cpu", "gpu_24g", "gpu_48g", "gpu_80g"):
        assert name in preset_names()
    assert load_preset("4080") == load_preset("qwen_4080_16g")
    assert load_preset("qwen_4080_16g")["seq_len"] == 384 and load_preset("safe")["grad_accum"] == 8


def test_precedence_defaults_preset_flags():
    cfg = resolve_config(flags={"data": "d", "output_dir": "o", "r": 64, "seq_len": None, "preset": "safe"})
    assert cfg.r == 64  # flag beats preset
    assert cfg.seq_len == 256  # preset beats default (512); an unset flag changes nothing
    assert cfg.weight_decay == TrainConfig().weight_decay  # default where neither says


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="unknown key 'rank' \\(did you mean 'adapter.r'\\?\\)"):
        resolve_config(overrides={"rank": 4}, flags={"preset": "cpu"})
    with pytest.raises(ConfigError, match="--preset 'nope' is unknown"):
        canonical_name("nope")
    with pytest.raises(ConfigError, match="model.backend = 'qlora4' \\(expected one of qlora, lora, full; flag"):
        TrainConfig(backend="qlora4")


def test_recommended_presets():
    assert recommend_preset("cpu", 24) == "cpu"
    assert recommend_preset("cuda", 16) == "qwen_4080_16g" and recommend_preset("cuda", 80) == "gpu_80g"


@pytest.mark.parametrize(("reported_gib", "preset"), [
    (7.6, "4080_safe"), (11.7, "gpu_12g"), (15.6, "qwen_4080_16g"), (23.6, "gpu_24g"), (47.5, "gpu_48g"),
    (79.2, "gpu_80g"), (139.8, "gpu_80g"), (5.8, "4080_safe")])
def test_each_card_size_gets_its_tier(reported_gib, preset):
    """A card reports a little under its nominal size (torch's total memory in GiB); it still gets its tier."""
    assert recommend_preset("cuda", reported_gib) == preset


def test_gpu_presets_have_no_lora_dropout():
    from mens.train.presets import card_presets

    for name in card_presets().values():
        assert load_preset(name).get("lora_dropout") == 0.0, name


def test_probe_names_a_preset_per_card_and_whether_a_qwen_fits(tmp_path):
    from mens.train.probe import card_table

    qwen15 = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "vocab_size": 151936,
              "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2,
              "tie_word_embeddings": True}
    rows = card_table(qwen15)
    assert [r["card_gb"] for r in rows] == [8, 12, 16, 24, 48, 80]
    assert all(r["estimate_gb"] > 0 and r["fits"] == (r["estimate_gb"] <= 0.9 * r["card_gb"]) for r in rows)
    assert [r["preset"] for r in card_table(None)] == [r["preset"] for r in rows]
    assert "estimate_gb" not in card_table(None)[0]


@pytest.mark.parametrize("cmd", [["train", "--help"], ["probe", "--help"], ["status", "--help"]])
def test_help_exits_zero(cmd):
    done = subprocess.run([sys.executable, "-m", "mens", *cmd], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout


def test_mens_help_does_not_import_torch():
    code = ("import sys\nfrom mens.cli.main import app\nimport mens.cli.train, mens.train.config, mens.train.presets\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_probe_reports_device_preset_and_estimate(tiny_model_dir):
    from mens.train.probe import estimate_memory_gb, probe_report

    rep = probe_report(tiny_model_dir, "cpu")
    assert rep["device"]["kind"] == "cpu" and rep["recommended_preset"] == "cpu"
    assert rep["estimate"]["total_gb"] > 0
    smol = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True}
    est = estimate_memory_gb(smol, backend="lora", r=16, seq_len=512, batch_size=4)
    assert 130 < est["params_m"] < 140 and 0.5 < est["total_gb"] < 6


def test_status_reads_progress_from_telemetry(tmp_path):
    from mens.cli.main import app  # noqa: F401  (registers the commands)
    from mens.train.telemetry import Telemetry, run_status

    t = Telemetry(tmp_path)
    t.emit("train_start", planned_steps=10)
    t.emit("step", step=3, total_steps=10, loss=1.5, lr=1e-4, tokens_per_s=100.0, eta_s=7.0, progress=0.3)
    s = run_status(tmp_path)
    assert s["state"] == "running" and s["step"] == 3 and s["progress"] == 0.3
    t.emit("train_complete", step=10, final_loss=0.5, wall_time_s=9.0)
    assert run_status(tmp_path)["state"] == "complete"
    done = subprocess.run([sys.executable, "-m", "mens", "status", str(tmp_path), "--json"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["final_loss"] == 0.5


def test_gradient_checkpointing_is_chosen_from_the_memory_estimate():
    from mens.train.presets import card_presets
    from mens.train.probe import choose_checkpointing, estimate_memory_gb

    qwen4b = {"hidden_size": 2560, "num_hidden_layers": 36, "vocab_size": 151936, "intermediate_size": 9728,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True}
    shape = {"backend": "lora", "r": 32, "seq_len": 4096, "batch_size": 4}
    without = estimate_memory_gb(qwen4b, **shape)["total_gb"]
    on, why = choose_checkpointing(None, model_config=qwen4b, memory_gb=without / 0.9 - 0.5, **shape)
    assert on and "> 90%" in why
    assert estimate_memory_gb(qwen4b, gradient_checkpointing=True, **shape)["total_gb"] < without
    off, why = choose_checkpointing(None, model_config=qwen4b, memory_gb=without / 0.9 + 0.5, **shape)
    assert not off and "fits" in why
    assert choose_checkpointing(None, model_config=qwen4b, memory_gb=None, **shape)[0] is False
    assert choose_checkpointing(False, model_config=qwen4b, memory_gb=1.0, **shape) == (
        False, "off (--no-gradient-checkpointing)")
    assert choose_checkpointing(True, model_config=qwen4b, memory_gb=1e6, **shape)[0] is True
    for name in card_presets().values():  # no preset forces it: the estimate decides per model and card
        assert "gradient_checkpointing" not in load_preset(name), name


def test_the_loss_estimate_counts_one_chunk_of_logits_not_all_of_them():
    from mens.train.probe import estimate_memory_gb

    qwen05 = {"hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936, "intermediate_size": 4864,
              "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}
    kw = dict(backend="qlora", r=16, seq_len=2048, gradient_checkpointing=True)
    short = estimate_memory_gb(qwen05, batch_size=1, **kw)["total_gb"]
    long = estimate_memory_gb(qwen05, batch_size=4, **kw)["total_gb"]
    # all logits and their gradients for 3 x 2048 more tokens would be ~7 GB; checkpointed activations add < 1
    assert long - short < 1


def test_the_estimate_matches_peaks_measured_on_a_gpu():
    """Peak allocated GB measured on an H100 (bench/results/gpu_train_speed-h100.json and -bs8-h100.json): the
    estimate may be a little above a measured peak, never far below it."""
    from mens.train.probe import estimate_memory_gb

    q05 = {"hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936, "intermediate_size": 4864,
           "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}
    q15 = {**q05, "hidden_size": 1536, "num_hidden_layers": 28, "intermediate_size": 8960, "num_attention_heads": 12}
    measured = [(q05, "qlora", 2, 8.0), (q05, "lora", 2, 8.5), (q05, "qlora", 8, 31.6), (q05, "lora", 8, 32.1),
                (q15, "qlora", 8, 63.0), (q15, "lora", 8, 64.8)]
    for cfg, backend, rows, peak in measured:
        est = estimate_memory_gb(cfg, backend=backend, r=16, seq_len=2048, batch_size=rows)["total_gb"]
        assert 0.95 * peak <= est <= 1.2 * peak, (cfg["hidden_size"], backend, rows, est, peak)
    # the headline job (gpu_headline-h100.json): Qwen3.5-4B's text model, 3 linear-attention layers in 4, QLoRA,
    # one 384-token row a pass, 9.2 GB measured; without its linear-attention term the estimate was 7.1 GB
    q35 = {"hidden_size": 2560, "intermediate_size": 9216, "num_hidden_layers": 32, "num_attention_heads": 16,
           "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320, "tie_word_embeddings": True,
           "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8}
    est = estimate_memory_gb(q35, backend="qlora", r=16, seq_len=384, batch_size=1)["total_gb"]
    assert 0.95 * 9.2 <= est <= 1.2 * 9.2, est

