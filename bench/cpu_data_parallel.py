"""Two CPU cores as one training process with two threads, or as two single-threaded processes under torchrun.

On a 2-core VM a second thread adds unevenly to a matmul (`bench/f32_linear_kernels.py`: 82-128 GFLOP/s on two
threads against 82-83 on one), so two processes that each keep one core busy might train faster than one process
that splits every op across both. mens trains unchanged under torchrun (gradients summed over gloo, the update that
of one process with the same global batch), so the question is only speed.

Each run is a fresh `mens train` of the recipe dogfood would train (its preset, seed, system prompt and data) on the
training file of a finished or data-only dogfood directory, `--steps` steps with the same global batch of 2 rows:
- `threads`: one process, `num_threads=2`, 2 rows a step;
- `processes`: `torchrun --nproc_per_node 2`, `OMP_NUM_THREADS=1 num_threads=1`, 1 row a step on each.
The arms alternate for `--repeats` rounds on a quiet CPU. A step's time is read from the run's telemetry (the first
step left out). Both arms train the same global batches, so their losses must agree to float rounding; the JSON
records both.

    .venv/bin/python bench/cpu_data_parallel.py --dogfood-dir /tmp/w/vs-s0/df --steps 16 --repeats 3
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
ARMS = ("threads", "processes")


def worker(arm: str, dogfood_dir: Path, steps: int, seed: int, out: Path, result: Path) -> None:
    from alternate import dogfood_recipe, step_events

    tc = dogfood_recipe(dogfood_dir, seed, out, steps)
    processes = 2 if arm == "processes" else 1
    tc.num_threads, tc.batch_size = 2 // processes, tc.batch_size // processes
    config = out.parent / f"{out.name}.yaml"
    config.write_text(tc.to_yaml())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if processes == 1:
        cmd = [sys.executable, "-m", "mens", "train", str(config)]
    else:
        env["OMP_NUM_THREADS"] = "1"
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        cmd = [torchrun, "--nproc_per_node", str(processes), "-m", "mens", "train", str(config)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    steps_done, times = step_events(out)
    result.write_text(json.dumps({"arm": arm, "processes": processes, "threads_each": tc.num_threads,
                                  "rows_each": tc.batch_size, "step_s": times,
                                  "losses": [e.get("loss") for e in steps_done],
                                  "tokens": [e.get("tokens") for e in steps_done]}))


def main() -> None:
    from alternate import dogfood_arms_parser, run_dogfood_arms, write_same_rows_report

    ap = dogfood_arms_parser(__doc__.splitlines()[0], ARMS, repeats=3)
    ap.add_argument("--out", type=Path,
                    default=REPO / "bench" / "results" / f"cpu_data_parallel-{socket.gethostname()}.json")
    args = ap.parse_args()
    runs = run_dogfood_arms(__file__, ARMS, args, worker)
    if runs is not None:
        write_same_rows_report("cpu_data_parallel", args, runs, "threads", "processes",
                               "mean step time over steps 2..N of dogfood's recipe, global batch 2 rows on both arms; "
                               "speedup = threads / processes, per round (above 1: two single-threaded processes "
                               "train faster)")


if __name__ == "__main__":
    main()
