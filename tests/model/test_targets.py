"""LoRA targets by discovery: every projection of every decoder layer, routers and towers never, precise names."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))  # tiny_archs, train_tiny (shared tiny-model helpers)

from tiny_archs import ARCHS, expected_targets, tiny_model  # noqa: E402

from mens.errors import ModelError  # noqa: E402
from mens.model.lora import attach_lora  # noqa: E402
from mens.model.targets import find_targets, module_regex  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _attach(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout -> 0 note on MoE models
        return attach_lora(model, r=2, alpha=4, dropout=0.05, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_projection_of_every_layer_is_adapted(arch):
    model = tiny_model(arch)
    want_modules, want_params = expected_targets(model)
    peft_model = _attach(model)
    t = peft_model.mens_targets
    via_params = {p.removesuffix(".weight") for p in t.parameters if p.endswith(".weight")}
    assert set(t.modules) | via_params == want_modules, arch  # every nn.Linear of the layers, routers aside
    assert {p for p in t.parameters if not p.endswith(".weight")} == want_params  # fused experts
    got = set(peft_model.base_model.targeted_module_names) | set(peft_model.base_model.targeted_parameter_names)
    assert got == set(t.modules) | set(t.parameters)
    assert not t.left_out
    assert not any("embed" in n or "lm_head" in n for n in got)
    if arch in ("qwen3_next", "qwen3_moe"):
        assert t.routers and all(r.endswith(("mlp.gate", "shared_expert_gate")) for r in t.routers)
        assert peft_model.peft_config["default"].lora_dropout == 0.0  # peft's ParamWrapper needs it
    if arch in ("qwen3_5", "qwen3_next"):  # both layer kinds adapted
        assert any(".linear_attn." in n for n in t.modules) and any(".self_attn." in n for n in t.modules)


def test_hybrid_and_moe_beat_the_old_table():
    """Qwen3.5 once had only its 12 MLP projections adapted and Qwen3-Next none; now all of them."""
    assert len(_attach(tiny_model("qwen3_5")).mens_targets.modules) == 5 + 4 + 2 * 3  # DeltaNet, attention, MLPs
    t = _attach(tiny_model("qwen3_next")).mens_targets
    assert len(t.modules) + len(t.parameters) == 7 + 6 + 4  # attn/DeltaNet, shared experts, fused experts


def test_regex_matches_exactly_the_listed_names():
    names = ["model.layers.0.linear_attn.out_proj", "model.layers.1.self_attn.q_proj", "model.layers.2.mlp.up_proj"]
    rx = module_regex("model.layers", names)
    assert all(re.fullmatch(rx, n) for n in names)
    for other in ("model.layers.0.self_attn.q_proj", "model.layers.1.linear_attn.out_proj", "model.layers.2.mlp.gate",
                  "model.visual.layers.2.mlp.up_proj", "model.layers.12.mlp.up_proj", "lm_head"):
        assert not re.fullmatch(rx, other), other


def test_vision_tower_with_the_same_leaf_names_is_left_alone():
    class WithTower(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.model, self.config = lm.model, lm.config
            self.visual = torch.nn.Module()  # a tower whose blocks outweigh nothing but share leaf names
            self.visual.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"q_proj": torch.nn.Linear(4, 4)})])

    model = WithTower(tiny_model("llama"))
    t = find_targets(model)
    assert t.layers_path == "model.layers" and not any("visual" in n for n in t.modules)
    assert not re.fullmatch(t.peft_kwargs()["target_modules"], "visual.layers.0.q_proj")


def test_top_layers_only():
    t = _attach(tiny_model("qwen3_5"), top_layers=1).mens_targets
    assert t.layers == [1] and t.modules and all(n.startswith("model.layers.1.") for n in t.modules)


def test_unwrappable_projection_fails_strict_and_warns_by_name():
    class Packed(torch.nn.Module):  # a projection peft's LoRA cannot wrap (not nn.Linear)
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(32, 64))

    model = tiny_model("llama")
    model.model.layers[1].mlp.down_proj = Packed()
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.down_proj \(Packed\).*--strict-targets"):
        find_targets(model, strict=True)
    with pytest.warns(UserWarning, match=r"stay frozen: model\.layers\.1\.mlp\.down_proj \(Packed\); adapting the"):
        t = find_targets(model)
    assert "model.layers.1.mlp.down_proj" not in t.modules and len(t.modules) == 13


def test_no_decoder_layers_is_a_model_error():
    with pytest.raises(ModelError, match="found no decoder layers.*--backend full"):
        find_targets(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_gpt2_conv1d_targets():
    import transformers

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2))
    peft_model = attach_lora(model, r=2, alpha=4, dropout=0.0, strict=True)
    t = peft_model.mens_targets
    assert t.layers_path == "transformer.h" and t.conv1d and peft_model.peft_config["default"].fan_in_fan_out
    assert {n.split(".", 3)[3] for n in t.modules} == {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}


def test_bnb_4bit_linear_counts_as_linear():
    bnb = pytest.importorskip("bitsandbytes")
    model = tiny_model("llama")
    lin = model.model.layers[0].self_attn.q_proj
    model.model.layers[0].self_attn.q_proj = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False)
    assert "model.layers.0.self_attn.q_proj" in find_targets(model).modules
