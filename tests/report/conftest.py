"""A finished-looking run for the report, card and publish tests: a tiny adapter run (tests.conftest.make_tiny_run)
with telemetry, summary, a resolved manifest, held-out results (two passed, two failed) and a gate receipt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SYSTEM = "You write Vox."


def _sample(output: str, passed: bool, reason: str | None = None) -> dict:
    fails = [] if passed else [{"category": "parse" if "parse" in (reason or "") else "contents", "reason": reason}]
    return {"sample_index": 0, "seed": 0, "attempts": 1, "output": output, "non_empty": True, "parse_ok": passed,
            "has_code": passed, "pass": passed, "failures": fails, "first_diagnostic": None, "decls": []}


def bench_results(model: str, bench: str) -> dict:
    """benchmark_results.json as eval-local writes it: 4 held-out tasks, base at 0, greedy and constrained modes."""
    tasks = [("fn-add", "Write add(a: int, b: int) to int in Vox.",
              "fn add(a: int, b: int) to int {\n    return a + b\n}", True, None),
             ("fn-neg", "Write neg(x: int) to int in Vox.", "fn neg(x: int) to int {\n    return -x\n}", True, None),
             ("fn-gcd", "Write gcd(a: int, b: int) to int with a while loop.", "fn gcd(a: int, b: int) to int {\n"
              "    return gcd(b, a % b)\n}", False, "missing required text 'while'"),
             ("fn-tag", "Write tag(raw: str) to str.", "fn tag(raw: str) to str {\n    return raw.replace(/x/g)\n}",
              False, "does not parse: 2:24: Unexpected token in expression: /")]
    results = [{"id": t, "category": "fn", "split": "heldout", "prompt": p, "pass_at_1": float(ok),
                "pass_at_k": float(ok), "samples": [_sample(out, ok, why)]} for t, p, out, ok, why in tasks]
    cat = {"fn": {"tasks": 4, "pass_at_1": 0.5, "nonempty_parse_rate": 0.75}}
    greedy = {"tasks": 4, "samples": 4, "nonempty_parse_rate": 0.75, "pass_at_1": 0.5, "pass_at_k": 0.5,
              "coverage": 1.0, "per_category": cat, "failures_by_category": {"contents": 1, "parse": 1},
              "gain_over_base": 0.75}
    constrained = {**greedy, "nonempty_parse_rate": 1.0,
                   "per_category": {"fn": {**cat["fn"], "nonempty_parse_rate": 1.0}}}
    base = {"tasks": 4, "samples": 4, "nonempty_parse_rate": 0.0, "pass_at_1": 0.0, "pass_at_k": 0.0, "coverage": 0.0,
            "per_category": {"fn": {"tasks": 4, "pass_at_1": 0.0, "nonempty_parse_rate": 0.0}}}
    failures = [{"id": t, "category": "fn", "failure": "contents" if "while" in why else "parse", "reason": why}
                for t, _, _, ok, why in tasks if not ok]
    return {"schema": "mens_benchmark_results_v1", "k": 1, "main_mode": "greedy", "metrics": greedy,
            "modes": {"greedy": greedy, "constrained": constrained}, "failures": failures, "results": results,
            "model": model, "bench": bench, "split": "heldout", "language": "vox",
            "base": {"metrics": base, "model": "/somewhere/base"}}


def finish_run(run: Path, base_dir: Path) -> Path:
    """Add what training, eval-local and gate write to a tiny run directory."""
    tel = [{"event": "train_start"}]
    tel += [{"event": "step", "step": i, "loss": 3.0 / i + 0.123456789, "tokens_per_s": 180.0 + i}
            for i in range(1, 11)]
    tel += [{"event": "eval", "step": 10, "val_loss": 0.987654321}]
    (run / "telemetry.jsonl").write_text("\n".join(json.dumps(e) for e in tel) + "\n")
    manifest = json.loads((run / "training_manifest.json").read_text())
    manifest.update({
        "base_model": str(base_dir), "base_model_id": str(base_dir), "system_prompt": SYSTEM,
        "data_sha256": "ab" * 32, "examples": {"train": 96, "val": 4},
        "config": {"data": str(run.parent / "data"), "output_dir": str(run), "model": str(base_dir),
                   "backend": "lora", "max_steps": 10, "seq_len": 128, "batch_size": 2, "grad_accum": 2,
                   "learning_rate": 0.0008, "warmup_steps": 30, "r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0,
                   "seed": 0, "log_every_s": 5.0, "system_prompt": SYSTEM},
        "steps": {"planned": 10, "completed": 10, "global_batch": 4, "warmup": 1},
        "versions": {"python": "3.11", "mens": "0.1.0"}})
    (run / "training_manifest.json").write_text(json.dumps(manifest))
    (run / "run_summary.json").write_text(json.dumps({
        "steps": 10, "first_loss": 4.123456789, "final_loss": 0.4234567891, "val_loss": 0.987654321,
        "tokens_per_s": 51.123456, "wall_time_s": 384.0612, "peak_memory": {"cpu_max_rss_mb": 3893.0}}))
    bench = bench_results(str(run), str(run.parent / "bench" / "heldout.jsonl"))
    (run / "benchmark_results.json").write_text(json.dumps(bench))
    (run / "gate_receipt.json").write_text(json.dumps({
        "schema": "vox_mens_gate_receipt_v1", "overall_passed": False,
        "gates": [{"gate": "min_parse_rate", "threshold": 0.8, "value": 0.75, "passed": False}]}))
    return run


@pytest.fixture
def finished_run(make_tiny_run):
    """(run dir, base dir) of a tiny adapter run with results; the base has no model card and no Hub id."""
    _, run, base_dir = make_tiny_run("lora")
    return finish_run(run, base_dir), base_dir


@pytest.fixture(autouse=True)
def _threads():
    """One torch thread: tiny models gain nothing from more, and on a shared CPU extra threads wait on each other."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
