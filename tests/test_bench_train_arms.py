"""The benches that train dogfood's recipe in two arms, run end to end on a tiny dogfood run's data and model.

- bench/shared_prefix_speed.py and bench/cpu_data_parallel.py train the same rows in both arms: the losses agree.
- bench/int8_base_speed.py records what each arm's preflight chose and the loss difference int8 makes.
- bench/cpu_step_profile.py profiles the asked steps of the run's model and times a plain matmul of its MLP's shape.
"""

import json
import platform
import shutil
import sys
from pathlib import Path

import pytest
from tests.conftest import tiny_dogfood_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import cpu_data_parallel  # noqa: E402
import cpu_step_profile  # noqa: E402
import int8_base_speed  # noqa: E402
import shared_prefix_speed  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def dogfood_dir(tmp_path_factory, tiny_base):
    from mens.dogfood import run_dogfood

    out = tmp_path_factory.mktemp("arms") / "df"
    run_dogfood(tiny_dogfood_config(out, tiny_base, modes=("greedy",)), log=lambda line: None)
    return out


def _arms(script, dogfood_dir: Path, out: Path, monkeypatch) -> dict:
    monkeypatch.setattr(sys, "argv", [script.__file__, "--dogfood-dir", str(dogfood_dir), "--steps", str(STEPS),
                                      "--repeats", "1", "--out", str(out)])
    script.main()
    return json.loads(out.read_text())


def _check_two_arms(rec: dict, arms: tuple[str, str]) -> None:
    assert [r["arm"] for r in rec["runs"]] == list(arms)  # one round, in the script's order
    for run in rec["runs"]:
        assert len(run["losses"]) == STEPS and len(run["step_s"]) == STEPS - 1  # the first step is warm-up
        assert all(isinstance(x, float) and x > 0 for x in run["losses"] + run["step_s"])
    assert rec["speedup"]["n"] == 1 and rec["speedup"]["min"] > 0


def test_shared_prefix_speed_trains_the_same_rows_both_ways(dogfood_dir, tmp_path, monkeypatch):
    rec = _arms(shared_prefix_speed, dogfood_dir, tmp_path / "shared.json", monkeypatch)
    _check_two_arms(rec, shared_prefix_speed.ARMS)
    assert rec["bench"] == "shared_prefix_speed" and rec["machine"]["cpu"] and rec["steps"] == STEPS
    assert rec["max_loss_difference"] < 0.02  # the same rows; a shared prefix only changes float rounding
    assert all(run["attention"] for run in rec["runs"])  # what the preflight said of attention, per arm


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="int8 base runs on x86 only")
def test_int8_base_speed_records_each_arms_choice_and_the_loss_difference(dogfood_dir, tmp_path, monkeypatch):
    # the f32 path, where int8 base applies, on any x86 CPU: the caps its docstring gives for a CPU with native bf16
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    rec = _arms(int8_base_speed, dogfood_dir, tmp_path / "int8.json", monkeypatch)
    _check_two_arms(rec, int8_base_speed.ARMS)
    assert rec["bench"] == "int8_base_speed" and rec["cpu"] and rec["steps"] == STEPS
    by_arm = {run["arm"]: run["preflight"] for run in rec["runs"]}
    assert all(p["matmul precision"].startswith("f32") for p in by_arm.values())
    assert by_arm["int8"]["int8 base"] and "int8 base" not in by_arm["f32"]  # int8 arm: swapped, or why not
    diff = rec["loss_relative_difference"]
    assert 0 <= diff["median"] <= diff["max"] < 0.2


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun is not installed beside this Python")
def test_cpu_data_parallel_trains_the_same_global_batch_in_one_or_two_processes(dogfood_dir, tmp_path, monkeypatch):
    rec = _arms(cpu_data_parallel, dogfood_dir, tmp_path / "dp.json", monkeypatch)
    _check_two_arms(rec, cpu_data_parallel.ARMS)
    by_arm = {run["arm"]: run for run in rec["runs"]}
    assert (by_arm["threads"]["processes"], by_arm["threads"]["rows_each"]) == (1, 2)
    assert (by_arm["processes"]["processes"], by_arm["processes"]["rows_each"]) == (2, 1)
    assert rec["max_loss_difference"] < 0.02  # gradients summed over the processes: the one-process update


def test_cpu_step_profile_profiles_the_asked_steps_of_the_runs_model(dogfood_dir, tiny_base, tmp_path, monkeypatch):
    from transformers import AutoConfig

    out = tmp_path / "profile.json"
    monkeypatch.setattr(sys, "argv", [cpu_step_profile.__file__, "--data", str(dogfood_dir / "data/train.jsonl"),
                                      "--model", str(tiny_base), "--steps", str(STEPS), "--first-profiled", "2",
                                      "--output", str(out)])
    monkeypatch.setenv("MENS_ALLOCATOR", "system")  # stay in this process: no re-execution under mimalloc
    cpu_step_profile.main()
    rec = json.loads(out.read_text())
    run = rec["run"]
    assert rec["model"] == str(tiny_base) and run["steps_profiled"] == STEPS - 1 and run["step_s"] > 0
    assert 0 < run["matmul_share"] <= 1 and run["matmul_gflop_per_step"] > 0 and run["top_ops"]
    config = AutoConfig.from_pretrained(tiny_base)
    assert rec["plain_matmul"]["shape"] == [int(run["tokens_per_step"]), config.hidden_size,
                                            config.intermediate_size]
    assert rec["plain_matmul"]["f32_gflops"] > 0
