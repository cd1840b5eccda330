"""`autocast` (bf16 matmuls where the device does them natively) and `lora_layers` (adapters on the top N layers)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from train_tiny import tiny_config

from mens.errors import ConfigError
from mens.train import run as run_mod
from mens.train.config import TrainConfig
from mens.train.run import autocast_dtype, run_training


def test_autocast_setting_resolves_per_device(monkeypatch):
    monkeypatch.setattr(run_mod, "cpu_has_native_bf16", lambda: True)
    assert autocast_dtype("auto", "cpu", "lora") is None  # f32 unless asked: the tests' exactness relies on it
    assert autocast_dtype("bf16", "cpu", "lora") == "bf16"
    assert autocast_dtype("off", "cpu", "full") is None
    monkeypatch.setattr(run_mod, "cpu_has_native_bf16", lambda: False)
    assert autocast_dtype("bf16", "cpu", "lora") is None  # emulated bf16 would be slower than f32


def test_a_onednn_isa_cap_below_bf16_means_no_native_bf16(monkeypatch, tmp_path):
    """ONEDNN_MAX_CPU_ISA below the bf16 instructions makes oneDNN emulate bf16, so the cpu preset trains in f32
    (how a bf16 CPU takes an AVX2-only CPU's path); a cap that keeps them changes nothing."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    real_path = run_mod.Path
    monkeypatch.setattr(run_mod, "Path", lambda p: real_path(cpuinfo) if p == "/proc/cpuinfo" else real_path(p))
    assert run_mod.cpu_has_native_bf16({})
    assert run_mod.cpu_has_native_bf16({"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"})
    assert run_mod.cpu_has_native_bf16({"ONEDNN_MAX_CPU_ISA": "DEFAULT"})
    for cap in ("AVX2", "avx512_core", "AVX512_CORE_VNNI", "SSE41"):
        assert not run_mod.cpu_has_native_bf16({"ONEDNN_MAX_CPU_ISA": cap}), cap
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not run_mod.cpu_has_native_bf16()  # the process's own environment by default
    cpuinfo.write_text("flags\t\t: fpu avx2\n")
    assert not run_mod.cpu_has_native_bf16({})


@pytest.mark.parametrize("backend", ["qlora", "lora", "full"])
def test_auto_is_bf16_for_every_backend_on_a_bf16_gpu(monkeypatch, backend):
    """On a bf16 GPU the adapter path trains in bf16 too (peft would otherwise run it, and save its inputs, in f32);
    `off` keeps f32, and a GPU without bf16 stays f32."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_dtype("auto", "cuda", backend) == "bf16"
    assert autocast_dtype("auto", "cuda:1", backend) == "bf16"
    assert autocast_dtype("off", "cuda", backend) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype("auto", "cuda", backend) is None


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="autocast = 'fp8'"):
        TrainConfig(data=str(tmp_path), output_dir=str(tmp_path / "o"), autocast="fp8")
    with pytest.raises(ConfigError, match="lora_layers = -1"):
        TrainConfig(data=str(tmp_path), output_dir=str(tmp_path / "o"), lora_layers=-1)


def test_bf16_run_learns_and_records_its_precision(monkeypatch, data_dir, tmp_path, tiny_model_dir):
    monkeypatch.setattr(run_mod, "cpu_has_native_bf16", lambda: True)  # bf16 autocast runs on any CPU (emulated)
    out = tmp_path / "bf16"
    s = run_training(tiny_config(data_dir, out, tiny_model_dir, autocast="bf16", max_steps=12, learning_rate=5e-2,
                                 save_every=0))
    assert s["final_loss"] < s["first_loss"], s
    man = json.loads((out / "training_manifest.json").read_text())
    assert man["matmul_dtype"] == "bf16" and man["config"]["autocast"] == "bf16"
    pre = json.loads((out / "training-preflight.json").read_text())
    assert any(c["check"] == "matmul precision" and c["detail"].startswith("bf16") for c in pre["checks"])
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert all(t.dtype == torch.float32 for t in adapter.values())  # master weights stay f32


def test_top_layers_only_adapt_those_and_load_with_peft(data_dir, tmp_path, tiny_model_dir):
    import peft
    from transformers import AutoModelForCausalLM

    out = tmp_path / "top1"
    run_training(tiny_config(data_dir, out, tiny_model_dir, lora_layers=1, max_steps=3, save_every=0))
    keys = load_file(str(out / "adapter_model.safetensors")).keys()
    assert keys and all(".layers.1." in k for k in keys), sorted(keys)[:4]  # the tiny model has layers 0 and 1
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out)
    n = sum(1 for name, _ in model.named_modules() if name.endswith("lora_A.default"))
    assert n == len(keys) // 2
