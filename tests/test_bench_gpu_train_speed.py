"""bench/gpu_train_speed.py: the plan, the budget, the ratios and MFU, and its `--device cpu --tiny` mode end to end
(in the default run, so CI runs the GPU bench's code path on CPU): mens always, TRL when `trl` imports (else the
JSON records why it was skipped)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

gts = pytest.importorskip("gpu_train_speed")
runs = gts.runs


def test_plan_puts_the_first_shape_qlora_pair_first_and_alternates_sides():
    plan = gts.plan_runs(["qwen2.5-0.5b", "qwen2.5-1.5b"], ["qlora", "lora"], ["mens", "trl"], 2)
    assert [(r["shape"], r["backend"], r["side"]) for r in plan[:4]] == [
        ("qwen2.5-0.5b", "qlora", "mens"), ("qwen2.5-0.5b", "qlora", "trl")] * 2
    assert len(plan) == 16 and plan[4]["backend"] == "lora" and plan[-1]["shape"] == "qwen2.5-1.5b"


def test_defaults_follow_the_device_and_tiny_mode():
    gpu = gts.parse_args(["--out", "x.json"])
    assert (gpu.repeats, gpu.steps, gpu.warmup, gpu.seq_len, gpu.grad_accum) == (3, 6, 2, 2048, 4)
    tiny = gts.parse_args(["--device", "cpu", "--tiny", "--out", "x.json"])
    assert (tiny.repeats, tiny.steps, tiny.warmup, tiny.seq_len) == (1, 2, 1, 128)
    smoke = gts.parse_args(["--smoke", "--tiny", "--out", "x.json"])
    assert (smoke.steps, smoke.warmup, smoke.repeats) == (2, 0, 1)


def test_estimate_uses_the_last_measured_run_of_its_kind():
    a = gts.parse_args(["--out", "x.json"])
    run = {"shape": "qwen2.5-0.5b", "backend": "qlora", "side": "mens", "repeat": 0}
    guess = gts.estimate_s(run, a, {})
    assert guess > 25  # overhead + tokens / guessed rate
    assert gts.estimate_s(run, a, {("qwen2.5-0.5b", "qlora", "mens"): 7.0}) == 7.0


def test_mfu_is_six_n_tokens_over_peak():
    assert gts.mfu(1000.0, 10**9, 600.0) == pytest.approx(6 * 1e9 * 1000 / 600e12, abs=1e-4)
    assert gts.mfu(None, 10**9, 989.4) is None and gts.mfu(1000.0, 10**9, None) is None


def test_summary_pairs_rounds_and_flags_different_tokens():
    def rec(side, sup_rate, mem, loss, sup=100):
        return {"shape": "s", "backend": "lora", "side": side, "ok": True, "supervised_tokens_per_s": sup_rate,
                "median_step_supervised_tokens_per_s": sup_rate * 1.5 if side == "mens" else sup_rate,
                "tokens_per_s": sup_rate * 2, "peak_rss_mb": mem, "first_batch_loss": loss,
                "timed_supervised_tokens": sup}

    results = [rec("mens", 300, 50, 2.0), rec("trl", 100, 100, 2.0), rec("mens", 200, 50, 2.0),
               rec("trl", 100, 100, 2.0)]
    s = gts.summarize(results, {"s": {"matmul_params": 10**6}}, 100.0, None)["s/lora"]
    assert s["mens_over_trl"]["supervised_tokens_per_s"] == {"min": 2.0, "median": 2.5, "max": 3.0, "n": 2}
    assert s["mens_over_trl"]["median_step_supervised_tokens_per_s"] == {"min": 3.0, "median": 3.75, "max": 4.5,
                                                                         "n": 2}
    assert s["sides"]["mens"]["median_step_supervised_tokens_per_s"]["median"] == 375.0
    for r in results:  # records from before the median-step rate: no ratio, the rest as before
        del r["median_step_supervised_tokens_per_s"]
    old = gts.summarize(results, {}, None, None)["s/lora"]
    assert old["mens_over_trl"]["median_step_supervised_tokens_per_s"] is None
    assert old["mens_over_trl"]["supervised_tokens_per_s"]["median"] == 2.5
    assert s["mens_over_trl"]["peak_memory"]["median"] == 0.5
    assert s["mens_over_trl"]["same_timed_tokens"] and s["mens_over_trl"]["first_batch_loss_abs_diff"] == 0
    results[1]["timed_supervised_tokens"] = 99
    assert not gts.summarize(results, {}, None, None)["s/lora"]["mens_over_trl"]["same_timed_tokens"]


def test_the_median_step_rate_leaves_out_a_one_time_stall():
    """Four timed steps of 100 supervised tokens, 0.1 s each but one of 0.5 s (a kernel's first compile): 500
    tokens/s over the timed steps, 1,000 at the median step's time; the warm-up step counts in neither."""
    clock = runs.StepClock("cpu")
    clock.t_start = 0.0
    ends = [2.0, 2.1, 2.6, 2.7, 2.8]  # a 2 s warm-up step, then 0.1, 0.5, 0.1, 0.1
    clock.steps = [{"t": t, "tokens": 200, "supervised": 100, "loss": 1.0} for t in ends]
    got = clock.timed(1)
    assert got["timed_steps"] == 4 and got["supervised_tokens_per_s"] == pytest.approx(500.0)
    assert got["median_step_supervised_tokens_per_s"] == pytest.approx(1000.0)
    assert got["step_s"] == [2.0, 0.1, 0.5, 0.1, 0.1]


def test_dry_run_prints_the_estimate_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert gts.main(["--device", "cpu", "--tiny", "--dry-run", "--out", str(out)]) == 0
    assert "estimate" in capsys.readouterr().out and not out.exists()


def test_tiny_cpu_mode_trains_both_sides_on_the_same_tokens(tmp_path):
    out = tmp_path / "gpu_train_speed.json"
    cmd = [sys.executable, str(BENCH / "gpu_train_speed.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--shapes", "qwen2.5-0.5b", "--backends", "lora", "--sides", "mens,trl,trl-liger", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert "commit" in doc  # its value: test_records_name_their_commit
    assert doc["skipped_sides"]["trl-liger"]  # Liger is a GPU side: skipped with its reason on CPU
    by_side = {r["side"]: r for r in doc["results"]}
    mens = by_side["mens"]
    assert mens["ok"] and mens["timed_steps"] == 2 and mens["supervised_tokens_per_s"] > 0
    assert mens["peak_rss_mb"] > 0 and mens["peft_targets"]
    # Real work: rows packed nearly full of the synthetic text (2 timed steps x 2 rows x 128 tokens), not of the
    # chat markers alone (what a tokenizer that lost the text would leave).
    assert mens["packed_rows"] >= 6 and mens["timed_input_tokens"] >= 0.8 * 2 * 2 * 128
    # every step's own time (warm-up steps included), so a slow stretch inside a run shows where it was
    assert len(mens["step_s"]) == len(mens["step_losses"]) and all(t > 0 for t in mens["step_s"])
    assert sum(mens["step_s"][-mens["timed_steps"]:]) == pytest.approx(mens["timed_s"], abs=0.01)
    assert mens["median_step_supervised_tokens_per_s"] > 0
    assert doc["summary"]["qwen2.5-0.5b/lora"]["sides"]["mens"]["median_step_supervised_tokens_per_s"]["n"] == 1
    if importlib.util.find_spec("trl") is None:
        assert "trl" in doc["skipped_sides"]
        return
    trl = by_side["trl"]
    assert trl["ok"] and trl["peft_targets"] == mens["peft_targets"]  # TRL adapts what mens adapted
    assert trl["timed_supervised_tokens"] == mens["timed_supervised_tokens"]
    # Same weights, same first packed row, the same objective: the same loss before any update (f32 on CPU).
    assert trl["first_batch_loss"] == pytest.approx(mens["first_batch_loss"], abs=1e-4)
    # and the same first optimizer step's loss (dropout draws differ: close, not equal)
    assert trl["step_losses"][0] == pytest.approx(mens["step_losses"][0], abs=1e-2)
    summary = doc["summary"]["qwen2.5-0.5b/lora"]["mens_over_trl"]
    assert summary["same_timed_tokens"] and summary["supervised_tokens_per_s"]["n"] == 1


def test_a_system_prompt_is_trained_on_both_sides_and_shared_by_mens(tmp_path):
    out = tmp_path / "gpu_train_speed.json"
    cmd = [sys.executable, str(BENCH / "gpu_train_speed.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--shapes", "qwen2.5-0.5b", "--backends", "lora", "--sides", "mens,trl", "--system-tokens", "24",
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["settings"]["system_tokens"] == 24
    by_side = {r["side"]: r for r in doc["results"]}
    mens = by_side["mens"]
    assert mens["ok"] and "common prompt prefix is computed once" in mens["attention"], mens["attention"]
    if importlib.util.find_spec("trl") is None:
        return
    trl = by_side["trl"]  # the same rows, prompt copies included: the same tokens and loss before any update
    assert trl["timed_input_tokens"] == mens["timed_input_tokens"]
    assert trl["first_batch_loss"] == pytest.approx(mens["first_batch_loss"], abs=1e-4)


def test_profile_mode_records_where_the_step_time_goes(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(BENCH / "gpu_train_speed.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--shapes", "qwen2.5-0.5b", "--backends", "lora", "--sides", "mens", "--profile", "1", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (rec,) = json.loads(out.read_text())["results"]
    prof = rec["profile"]
    assert prof["clock"] == "cpu" and prof["total_ms"] > 0
    names = [op["name"] for op in prof["ops"]]
    assert any("mm" in n for n in names), names  # the matmuls of the recorded step are in the table
    assert all(a["self_ms"] >= b["self_ms"] for a, b in zip(prof["ops"], prof["ops"][1:], strict=False))


def test_grouped_mode_runs_every_side_of_a_shape_in_one_process(tmp_path):
    """--grouped (what a device call uses): mens, its loss-kernel A/B side and TRL share one process per shape,
    each run still counted on its own."""
    out = tmp_path / "grouped.json"
    sides = "mens,mens-chunked" + (",trl" if importlib.util.find_spec("trl") else "")
    cmd = [sys.executable, str(BENCH / "gpu_train_speed.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--grouped", "--warm-run", "--shapes", "qwen2.5-0.5b", "--backends", "lora", "--sides", sides,
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["settings"]["grouped"] and not doc["skipped_runs"]
    by_side = {r["side"]: r for r in doc["results"]}
    assert set(by_side) == set(sides.split(",")) and all(r["ok"] for r in by_side.values())
    # each side ran once untimed first, in the same process, and stays out of the results and the summary
    assert doc["settings"]["warm_run"] and [w["side"] for w in doc["warm_runs"]] == sides.split(",")
    assert all(w["supervised_tokens_per_s"] and not w["error"] for w in doc["warm_runs"])
    assert len(doc["results"]) == len(by_side)
    assert "group qwen2.5-0.5b" in p.stdout  # one process for the shape's runs
    # On CPU both mens sides take mens' own loss loop: the same loss on the same first row
    assert by_side["mens-chunked"]["first_batch_loss"] == by_side["mens"]["first_batch_loss"]
    ratio = doc["summary"]["qwen2.5-0.5b/lora"]["mens_over_mens-chunked"]
    assert ratio["same_timed_tokens"] and ratio["supervised_tokens_per_s"]["n"] == 1


def _tiny_0_5b_run(tmp_path, backend: str, sides: str) -> dict:
    """The bench's record of tiny Qwen2.5-0.5B-shaped runs on CPU, one process, no LoRA dropout."""
    out = tmp_path / "sides.json"
    cmd = [sys.executable, str(BENCH / "gpu_train_speed.py"), "--device", "cpu", "--tiny", "--threads", "1",
           "--grouped", "--shapes", "qwen2.5-0.5b", "--backends", backend, "--sides", sides,
           "--lora-dropout", "0", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def test_fused_mlp_and_attention_sides_and_dropout_flag(tmp_path):
    """--lora-dropout 0 reaches both sides' configs; `mens-peft` (peft's MLP modules) is the fused MLP's A/B and
    `mens-mask` (the block mask) the per-example attention's: the default mens run records both features, each A/B
    side lacks its own, and all start from the same loss."""
    doc = _tiny_0_5b_run(tmp_path, "lora", "mens,mens-peft,mens-mask")
    assert doc["shared_settings"]["lora_dropout"] == 0.0
    by_side = {r["side"]: r for r in doc["results"]}
    assert by_side["mens"]["fused_lora_mlp"].endswith("decoder layers (gated-MLP products recomputed in backward)")
    assert by_side["mens-peft"]["fused_lora_mlp"] == "peft's"
    assert by_side["mens"]["layer_kernels"] == "torch's"  # Liger's layer kernels are CUDA-only
    assert by_side["mens-peft"]["first_batch_loss"] == pytest.approx(by_side["mens"]["first_batch_loss"], rel=1e-6)
    assert by_side["mens"]["attention"].startswith("packed rows attend one example at a time")
    assert by_side["mens-mask"]["attention"] == "block mask"
    sides = doc["summary"]["qwen2.5-0.5b/lora"]["sides"]  # the summary says what each side ran
    assert sides["mens-mask"]["attention"] == "block mask" and sides["mens-peft"]["fused_lora_mlp"] == "peft's"
    assert by_side["mens-mask"]["first_batch_loss"] == pytest.approx(by_side["mens"]["first_batch_loss"], rel=1e-5)


def test_records_name_their_commit(tmp_path, monkeypatch):
    """A record names the commit it ran: from git in a checkout, else from the .commit file a device call carries
    (its copy of the tree has no .git), else None; never a guess."""
    import machine

    monkeypatch.setattr(machine, "REPO", tmp_path)  # not a git checkout
    monkeypatch.setattr(machine, "COMMIT_FILE", tmp_path / ".commit")
    assert machine.commit() is None
    (tmp_path / ".commit").write_text("abc1234\n", encoding="utf-8")
    assert machine.commit() == "abc1234 (from .commit)"
    monkeypatch.setattr(machine, "REPO", BENCH.parent)
    here = machine.commit()
    if here is not None and "(from" not in here:  # this checkout's own git
        assert here.split("+")[0] and all(c in "0123456789abcdef" for c in here.split("+")[0])


def test_flat_absmax_side(tmp_path):
    """`mens-flat` is mens with every 4-bit projection's absmax dequantized once (the A/B for QLoRA's cost over LoRA):
    it runs on the CPU path, says so in its record, and starts from mens' own loss."""
    by_side = {r["side"]: r for r in _tiny_0_5b_run(tmp_path, "qlora", "mens,mens-flat")["results"]}
    assert by_side["mens"]["flat_absmax"] is False
    assert by_side["mens-flat"]["flat_absmax"].endswith("4-bit projections dequantize from an absmax kept in f32")
    assert by_side["mens-flat"]["fused_lora_mlp"].endswith("(gated-MLP products recomputed in backward)")
    assert by_side["mens-flat"]["first_batch_loss"] == pytest.approx(by_side["mens"]["first_batch_loss"], rel=1e-5)
