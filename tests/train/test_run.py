"""End to end on a tiny Llama: LoRA, QLoRA and full runs write the documented files and overfit a small batch;
the adapter loads with plain peft; accumulation is token-weighted."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from safetensors.torch import load_file
from train_tiny import build_tokenizer, tiny_config, vox_rows, write_jsonl

from mens.train.run import run_training

COMMON = {"chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "training_manifest.json",
          "training-preflight.json", "telemetry.jsonl", "run_summary.json", "config.yaml"}
ADAPTER = {"adapter_config.json", "adapter_model.safetensors"}
FULL = {"config.json", "generation_config.json", "model.safetensors", "system_prompt.txt"}
STATE = {"optimizer.safetensors", "scheduler.json", "rng.safetensors", "state.json", "checksums.json"}


def _files(root):
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def small_data(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    write_jsonl(d / "train.jsonl", vox_rows(8))
    return d


@pytest.mark.parametrize("backend", ["lora", "qlora", "full"])
def test_backend_writes_documented_run_and_overfits(backend, small_data, tmp_path, tiny_model_dir):
    out = tmp_path / backend
    cfg = tiny_config(small_data, out, tiny_model_dir, backend=backend, max_steps=30, batch_size=8, val_fraction=0,
                      min_examples=4, learning_rate=1e-2 if backend == "full" else 5e-2, r=8, lora_alpha=16,
                      save_every=20, eval_every=0)
    summary = run_training(cfg)
    weights = FULL if backend == "full" else ADAPTER
    ckpt = {f"checkpoints/step-20/{f}" for f in (STATE | (weights - {"system_prompt.txt"}))}
    assert _files(out) == COMMON | weights | ckpt
    print(f"{backend}: first loss {summary['first_loss']:.3f} -> final {summary['final_loss']:.3f}")
    assert summary["final_loss"] < summary["first_loss"] / 2, summary
    events = [json.loads(line)["event"] for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert events[0] == "train_start" and events[-1] == "train_complete"
    assert events.count("step") == 30 and events.count("checkpoint") == 1
    step = next(json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines() if '"step"' in line)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "eta_s", "progress"} <= set(step)
    man = json.loads((out / "training_manifest.json").read_text())
    assert man["backend"] == backend and len(man["data_sha256"]) == 64 and len(man["base_weights_sha256"]) == 64
    assert man["steps"]["completed"] == 30 and man["seeds"]["seed"] == cfg.seed and man["versions"]["torch"]
    assert summary["peak_memory"]["cpu_max_rss_mb"] > 0 and summary["tokens_per_s"] > 0
    pre = json.loads((out / "training-preflight.json").read_text())
    assert pre["passed"] and {c["check"] for c in pre["checks"]} >= {"data", "model files", "first loss"}
    # not forced by flag or preset: chosen from the memory estimate (a tiny model fits anywhere)
    assert man["gradient_checkpointing"]["on"] is False and "fits" in man["gradient_checkpointing"]["why"]


def test_adapter_loads_with_plain_peft_and_matches(data_dir, tmp_path, tiny_model_dir):
    import peft
    import transformers

    from mens.model.inference import load_for_inference
    from mens.model.load import load_base
    from mens.model.lora import attach_lora, load_adapter_weights

    out = tmp_path / "run"
    run_training(tiny_config(data_dir, out, tiny_model_dir, max_steps=4, save_every=0))
    ids = torch.tensor([[5, 17, 33, 2, 90, 41]])
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain = peft.PeftModel.from_pretrained(base, out).eval()
    ours = attach_lora(load_base(tiny_model_dir, backend="lora", device="cpu"), r=4, alpha=8, dropout=0.0)
    load_adapter_weights(ours, out)
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, ours.eval()(input_ids=ids).logits
        untuned = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
        loaded = load_for_inference(out, device="cpu")
        c = loaded.model(input_ids=ids).logits
    print(f"peft parity: {(a - b).abs().max().item():.2e}, load_for_inference {(a - c).abs().max().item():.2e}")
    assert (a - b).abs().max() < 1e-6 and (a - c).abs().max() < 1e-6
    assert (a - untuned).abs().max() > 1e-3  # the adapter changed the model
    assert loaded.system_prompt == "You write Vox."


def test_accumulation_matches_one_big_batch(data_dir, tmp_path, tiny_model_dir):
    """batch 8 x accum 1 and batch 2 x accum 4: same gradients, same adapter after 3 steps."""
    from mens.model.load import load_base
    from mens.model.lora import attach_lora
    from mens.train.data import build_rows
    from mens.train.loop import accumulate_gradients
    from mens.train.packing import row_supervised
    from mens.train.text import encode_chat

    tok = build_tokenizer()
    exs = [encode_chat(tok, [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["response"]}],
                       seq_len=96) for r in vox_rows(10) if "prompt" in r][:8]
    rows = build_rows(exs, pack=False, seq_len=96)
    n_sup = float(sum(row_supervised(r) for r in rows))
    grads = []
    for bs in (8, 2):
        torch.manual_seed(0)
        model = attach_lora(load_base(tiny_model_dir, backend="lora", device="cpu"), r=4, alpha=8, dropout=0.0)
        with torch.no_grad():  # non-zero B so that A gets gradients too
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        micro = [rows[i:i + bs] for i in range(0, 8, bs)]
        accumulate_gradients(model, micro, n_sup, pad_id=0, device="cpu", autocast=contextlib.nullcontext)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    grad_diff = max((grads[0][n] - grads[1][n]).abs().max().item() for n in grads[0])
    print(f"accumulation: max grad diff {grad_diff:.2e}")
    assert grad_diff < 1e-6
    outs = []
    for bs, acc in ((8, 1), (2, 4)):
        out = tmp_path / f"b{bs}"
        run_training(tiny_config(data_dir, out, tiny_model_dir, max_steps=3, batch_size=bs, grad_accum=acc,
                                 save_every=0, pack=False))
        outs.append(load_file(str(out / "adapter_model.safetensors")))
    adapter_diff = max((outs[0][k] - outs[1][k]).abs().max().item() for k in outs[0])
    print(f"accumulation: max adapter diff after 3 steps {adapter_diff:.2e}")
    assert adapter_diff < 1e-5


def test_full_run_loads_as_a_model_dir_with_its_system_prompt(data_dir, tmp_path, tiny_model_dir):
    from mens.model.inference import load_for_inference

    out = tmp_path / "full"
    run_training(tiny_config(data_dir, out, tiny_model_dir, backend="full", max_steps=2, save_every=0,
                             learning_rate=1e-3))
    loaded = load_for_inference(out, device="cpu")
    assert loaded.kind == "model" and loaded.system_prompt == "You write Vox."


@pytest.mark.gpu
def test_qlora_on_cuda_uses_bf16_compute(data_dir, tmp_path, tiny_model_dir):
    out = tmp_path / "gpu"
    summary = run_training(tiny_config(data_dir, out, tiny_model_dir, backend="qlora", device="cuda", max_steps=4,
                                       save_every=2))
    assert summary["peak_memory"]["cuda_max_allocated_mb"] > 0 and summary["final_loss"] < summary["first_loss"]


def test_qlora_eval_pass_keeps_input_gradients_right(tiny_model_dir):
    """bitsandbytes repacks NF4 weights for a no-autograd CPU kernel after an eval/no-grad pass; mens turns that off,
    so LoRA gradients in early layers (which flow back through frozen 4-bit layers) stay the same."""
    from mens.model.load import load_base
    from mens.model.lora import attach_lora

    ids = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 8]])
    grads = []
    for eval_first in (False, True):
        torch.manual_seed(0)
        model = attach_lora(load_base(tiny_model_dir, backend="qlora", device="cpu"), r=4, alpha=8, dropout=0.0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        if eval_first:
            model.eval()
            with torch.no_grad():
                model(input_ids=ids)
            model.train()
        model(input_ids=ids).logits.logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if "layers.0." in n and p.grad is not None})
    assert grads[0] and all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


def test_the_time_limit_stops_the_run_at_a_step_with_its_adapter_saved_and_validated(small_data, tmp_path,
                                                                                       tiny_model_dir):
    """schedule.max_time_s (what `mens dogfood --budget` sets): once the loop has run that long it stops after the
    step in progress, validates and saves as at a planned end, and says so in the summary and telemetry."""
    out = tmp_path / "capped"
    cfg = tiny_config(small_data, out, tiny_model_dir, backend="lora", max_steps=50, batch_size=4, val_fraction=0.25,
                      min_examples=4, save_every=0, eval_every=0)
    cfg.max_time_s = 1e-6  # already reached after the first step
    summary = run_training(cfg)
    assert summary["stopped_early"] is True and summary["steps"] == 1 and summary["val_loss"] is not None
    assert (out / "adapter_model.safetensors").is_file()
    events = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("step") == 1
    assert next(e for e in events if e["event"] == "time_limit")["total_steps"] == 50
    assert events[-1]["event"] == "train_complete"
    uncapped = run_training(tiny_config(small_data, tmp_path / "free", tiny_model_dir, backend="lora", max_steps=3,
                                        batch_size=4, val_fraction=0.25, min_examples=4, save_every=0, eval_every=0))
    assert uncapped["stopped_early"] is False and uncapped["steps"] == 3


def test_a_share_of_the_validation_rows_is_read_and_named_in_the_eval_event(data_dir, tmp_path, tiny_model_dir):
    """val_share (dogfood's budget probe): every k-th validation row only, and the eval event gives the tokens it
    read beside those of every row, so that the probe can scale the pass's time to a whole one."""
    def evals(out):
        return [e for e in (json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines())
                if e["event"] == "eval"]

    kw = dict(backend="lora", max_steps=1, val_fraction=0.4, pack=False, save_every=0, eval_every=0)
    run_training(tiny_config(data_dir, tmp_path / "whole", tiny_model_dir, **kw))
    run_training(tiny_config(data_dir, tmp_path / "part", tiny_model_dir, **kw), val_share=0.25)
    [whole], [part] = evals(tmp_path / "whole"), evals(tmp_path / "part")
    assert whole["tokens"] == whole["all_tokens"] == part["all_tokens"] > 0
    assert 0 < part["tokens"] < whole["tokens"] / 2  # every fourth of the unpacked rows
    assert part["val_loss"] != whole["val_loss"]


def test_validation_runs_at_each_epochs_end_by_default_as_the_original_did(data_dir, tmp_path, tiny_model_dir):
    """eval.eval_every defaults to "epoch": a validation pass at the end of each pass over the data (the original's
    rule) and at the run's last step, not every fixed number of steps; a number still means every N steps."""
    from mens.train.config import TrainConfig
    from mens.train.loop import validation_due

    assert TrainConfig().eval_every == "epoch"
    assert [s for s in range(1, 13) if validation_due("epoch", s, 5)] == [5, 10]
    assert [s for s in range(1, 13) if validation_due(4, s, 5)] == [4, 8, 12]
    assert not any(validation_due(0, s, 5) for s in range(1, 13))

    kw = dict(backend="lora", pack=False, batch_size=4, val_fraction=0.25, min_examples=4, save_every=0)
    out = tmp_path / "epochs"
    run_training(tiny_config(data_dir, out, tiny_model_dir, max_steps=0, epochs=2.5, eval_every="epoch", **kw))
    events = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    per_epoch = next(e for e in events if e["event"] == "train_start")["steps_per_epoch"]
    total = [e for e in events if e["event"] == "step"][-1]["step"]
    assert total > 2 * per_epoch  # two whole epochs and a part
    assert [e["step"] for e in events if e["event"] == "eval"] == [per_epoch, 2 * per_epoch, total]
