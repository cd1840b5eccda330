"""`mens train` end to end on every architecture family: all decoder projections adapted, packing adapted to the
attention kind (varlen boundaries for linear attention, unpacked where the kernels cannot take them), the loss goes
down, and the adapter loads in plain peft with the same logits."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from tiny_archs import ARCHS, build_arch_dir, expected_targets, tiny_model
from train_tiny import build_tokenizer, tiny_config, vox_rows

from mens.train.run import run_training

HYBRIDS = ("qwen3_5", "qwen3_next")


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    return lambda arch: build_arch_dir(root / arch, arch) if not (root / arch).is_dir() else root / arch


def _steps(run):
    events = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e.get("event") == "step"]


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _check_plain_peft(model_dir, run):
    """Plain peft loads the saved adapter and gives the logits of mens's own adapter with the saved tensors."""
    import peft
    import transformers
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    from mens.model.lora import adapter_state, attach_lora

    saved = load_file(str(run / "adapter_model.safetensors"))
    cfg = json.loads((run / "adapter_config.json").read_text())
    ids = torch.tensor([list(vox_rows(1)[0]["prompt"].encode()[:24])]) % 200 + 3  # any in-vocabulary ids
    base = _logits(transformers.AutoModelForCausalLM.from_pretrained(model_dir), ids)
    plain = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(model_dir), run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = attach_lora(transformers.AutoModelForCausalLM.from_pretrained(model_dir), r=cfg["r"],
                           alpha=cfg["lora_alpha"], dropout=cfg["lora_dropout"])
    assert set(adapter_state(ours)) == set(saved)  # every adapter tensor was saved, nothing else
    set_peft_model_state_dict(ours, saved)
    a, b = _logits(plain, ids), _logits(ours, ids)
    assert (a - base).abs().max() > 1e-4  # the trained adapter changes the output
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)  # ~1 s each after the first test's imports
def test_train_end_to_end(arch, tmp_path, data_dir, arch_dirs):
    model_dir, out = arch_dirs(arch), tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run_training(tiny_config(data_dir, out, model_dir, max_steps=6, save_every=0))
    notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    manifest = json.loads((out / "training_manifest.json").read_text())
    adapter = manifest["adapter"]

    want_modules, want_params = expected_targets(tiny_model(arch))
    via_params = {p.removesuffix(".weight") for p in adapter["parameters"] if p.endswith(".weight")}
    assert set(adapter["modules"]) | via_params == want_modules
    assert {p for p in adapter["parameters"] if not p.endswith(".weight")} == want_params
    assert adapter["trainable_parameters"] > 0 and not adapter["left_out"]
    assert manifest["target_modules"] == adapter["modules"]

    packing = manifest["packing"]
    if arch in HYBRIDS:  # the CPU torch fallbacks cannot take varlen boundaries: one example per row, one note
        assert packing["mode"] == "unpacked" and "flash-linear-attention" in packing["note"]
        assert sum("packing off" in n for n in notes) == 1
    else:
        # on CPU every softmax-attention architecture here takes per-example attention (mens.train.segment_attention)
        assert packing == {"mode": "segments"} and not any("packing" in n for n in notes)

    losses = _steps(out)
    print(f"{arch}: {len(adapter['modules'])} modules + {len(adapter['parameters'])} parameters, "
          f"{adapter['trainable_parameters']} trainable; packing {packing['mode']}; losses {losses}")
    assert len(losses) == 6 and all(map(torch.isfinite, torch.tensor(losses)))
    assert summary["final_loss"] < summary["first_loss"] and min(losses[-2:]) < losses[0]
    _check_plain_peft(model_dir, out)


# --- linear attention with kernels that honour varlen boundaries (a CPU stand-in for flash-linear-attention) ---


def _segments(cu):
    return list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))


@pytest.fixture
def varlen_kernels(monkeypatch):
    """Replace the chunked delta rule and the short convolution of Qwen3.5 / Qwen3-Next with per-segment calls of
    transformers' own torch reference: what flash-linear-attention and causal-conv1d do with cu_seqlens/seq_idx."""
    _install_kernels(monkeypatch, honour_boundaries=True)


def _install_kernels(monkeypatch, *, honour_boundaries: bool):
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_next import modeling_qwen3_next

    def unwrap(fn):
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        return fn

    for mod in (modeling_qwen3_5, modeling_qwen3_next):
        rule, conv = unwrap(mod.torch_chunk_gated_delta_rule), unwrap(mod.causal_conv1d_fn)

        def chunk_rule(q, k, v, g, beta, cu_seqlens=None, _rule=rule, **kw):
            kw = {n: kw[n] for n in ("initial_state", "output_final_state", "use_qk_l2norm_in_kernel") if n in kw}
            if cu_seqlens is None or not honour_boundaries:  # the injected fault: state runs across examples
                return _rule(q, k, v, g=g, beta=beta, **kw)
            assert q.shape[0] == 1, "varlen kernels take one flattened row"
            outs = [_rule(q[:, s:e], k[:, s:e], v[:, s:e], g=g[:, s:e], beta=beta[:, s:e], **kw)[0]
                    for s, e in _segments(cu_seqlens)]
            return torch.cat(outs, 1), None

        def conv1d(x, weight, bias=None, activation=None, seq_idx=None, _conv=conv, **kw):
            if seq_idx is None or not honour_boundaries:
                return _conv(x, weight, bias, activation=activation)
            bounds = torch.nonzero(torch.diff(seq_idx[0], prepend=seq_idx[0, :1] - 1)).flatten().tolist()
            cuts = [*bounds, x.shape[-1]]
            return torch.cat([_conv(x[..., s:e], weight, bias, activation=activation)
                              for s, e in zip(cuts[:-1], cuts[1:], strict=True)], -1)

        monkeypatch.setattr(mod, "torch_chunk_gated_delta_rule", chunk_rule)
        monkeypatch.setattr(mod, "causal_conv1d_fn", conv1d)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_varlen_kernels_keep_packed_rows_apart(arch, varlen_kernels):
    """With boundary-aware kernels the 2-row leak check passes and a packed batch's loss equals the unpacked sum."""
    import contextlib

    from mens.corpus.records import TrainPair
    from mens.train.packing import batch_loss_sum, pack_examples
    from mens.train.preflight import packing_problem
    from mens.train.text import chat_for_row, encode_chat

    tok = build_tokenizer()
    model = tiny_model(arch, vocab=len(tok)).eval()
    assert packing_problem(model, "cpu", contextlib.nullcontext, len(tok)) is None
    examples = [encode_chat(tok, chat_for_row(TrainPair(**r), "SYS"), seq_len=96) for r in vox_rows(6)]
    rows = pack_examples(examples, 160)
    assert len(rows) >= 2 and any(len(r) > 1 for r in rows)  # several rows, some packed
    with torch.no_grad():
        packed, n = batch_loss_sum(model, rows, 0, "cpu", contextlib.nullcontext)
        single = sum(batch_loss_sum(model, [[ex]], 0, "cpu", contextlib.nullcontext)[0] for ex in examples)
    assert n == sum(ex.n_supervised for ex in examples)
    assert abs(packed.item() - single.item()) / n < 1e-5


def test_without_varlen_kernels_the_leak_check_names_the_missing_package():
    import contextlib

    from mens.train.preflight import packing_problem

    model = tiny_model("qwen3_5").eval()
    problem = packing_problem(model, "cpu", contextlib.nullcontext, 300)
    assert problem is not None and "varlen boundaries" in problem and "flash-linear-attention" in problem


def test_hybrid_trains_packed_with_varlen_kernels(tmp_path, data_dir, arch_dirs, varlen_kernels):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback note
        summary = run_training(tiny_config(data_dir, out, arch_dirs("qwen3_5"), max_steps=4, save_every=0))
    manifest = json.loads((out / "training_manifest.json").read_text())
    assert manifest["packing"] == {"mode": "varlen"}
    assert manifest["examples"]["train_rows"] < manifest["examples"]["train"]  # rows really hold several examples
    checks = {c["check"]: c for c in json.loads((out / "training-preflight.json").read_text())["checks"]}
    assert checks["packing isolation"]["ok"] and "varlen" in checks["packing isolation"]["detail"]
    assert summary["final_loss"] < summary["first_loss"]


def test_kernels_that_ignore_boundaries_are_caught_and_the_run_falls_back(tmp_path, data_dir, arch_dirs, monkeypatch):
    """Fault: varlen kernels that accept cu_seqlens/seq_idx but let state cross examples. The 2-row leak check sees
    it and the run trains unpacked with one note instead of training on leaked context."""
    import contextlib

    from mens.train.preflight import packing_problem

    _install_kernels(monkeypatch, honour_boundaries=False)
    problem = packing_problem(tiny_model("qwen3_5").eval(), "cpu", contextlib.nullcontext, 300)
    assert problem == "varlen boundaries (cu_seq_lens, seq_idx) do not keep packed examples apart in this architecture"
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="packing off for qwen3_5_text: varlen boundaries .* do not keep"):
        run_training(tiny_config(data_dir, out, arch_dirs("qwen3_5"), max_steps=2, save_every=0))
    manifest = json.loads((out / "training_manifest.json").read_text())
    assert manifest["packing"]["mode"] == "unpacked"
    assert manifest["examples"]["train_rows"] == manifest["examples"]["train"]  # re-planned: one example per row
