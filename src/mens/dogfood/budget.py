"""`mens dogfood --budget 30m`: fit the training steps to a wall-clock budget, measured on this machine.

CPUs here differ up to 2x in training speed (native bf16 or not, AVX-512 or AVX2 only), so a step count that
takes 30 minutes on one takes an hour on another. Instead of a fixed count, dogfood trains a few probe steps of
the real recipe on the real data, times them, and gives training what the budget leaves once the stages before
it (measured) and after it (estimated from the base model's own evaluation time) are paid for:

    steps * step_s + val_passes * val_share * val_s + startup_s <= budget - elapsed - reserve

`elapsed` starts when the command did: `scripts/mens` records that moment before it builds the virtual environment
(a first run's minute or two), so a new user's first command keeps the budget too.

The recipe's own step count is the ceiling (a fast machine does not train longer than the recipe asks). The plan
and every number behind it go into `budget.json` and the stage note, so the user sees what was chosen and why.
Three probe steps misjudge the run's mean step time by up to a fifth on a shared machine, so the plan is only the
start: the training run re-fits its step count to its time limit from its own step time at 20, 40, 60, 80 and
90% of the way (`schedule.fit_to_time`, mens.train.schedule), with a learning-rate curve that stays continuous.
Only the length changes: a cut schedule trains the preset's recipe as it is (the cpu preset's LoRA+ was measured
at 27%, 71-81% and 100% of its steps; docs/benchmarks.md, "A 30-minute budget").
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from mens.errors import UsageError
from mens.run_records import write_json

PROBE_STEPS = 4
"""Optimizer steps the probe trains; the first is not timed (allocation, first-call kernels)."""
PROBE_VAL_SHARE = 1 / 16
"""Share of the validation rows the probe's validation pass reads (every sixteenth row, a quarter of the run's
final pass: RUN_VAL_SHARE); the whole pass is that time scaled by the tokens of every row. A whole pass cost the
probe 55-58 s (9-10 steps) on 2 Zen 3 cores, and over every fourth row the part still took 12-16 s there. Over
every sixteenth the probe took 43-45 s in all against 50-59 s, and its scaled time priced the run's final pass
at 14.1-14.4 s where that pass took 11.0-16.4 s (dogfood-budget30-avx2-zen3-reserve35-*.json)."""
RUN_VAL_SHARE = 0.25
"""Share of the validation rows a budgeted run's final pass reads (every fourth row). Dogfood decides
nothing on the validation loss, and the whole pass took 46-62 s, 7-9 steps, of a 30-minute budget on 2 Zen 3 cores
(bench/results/dogfood-budget30-avx2-zen3-*.json); a quarter of it leaves those steps to training. The loss is then
over the same rows in every budgeted run, not over all of them; `--budget none` validates on every row."""
POST_TRAIN_FACTOR = 3.0
"""The stages after training against the base model's greedy evaluation (same tasks, same token budget), beyond
POST_TRAIN_FIXED_S. Both decode in batches whose ended answers leave the batch. In dogfood the stages after training
took 1.1-2.4 base evals on CPUs with native bf16 and on the f32 path capped to AVX2
(bench/results/dogfood-budget30-bf16-*.json, -avx2cap-*.json), and 1.8-3.2 on an AVX2-only Zen 3, where the budget
trains 16-23% of the recipe and the tuned model fails most (-avx2-zen3-*.json; 2.18-2.80 once the constrained mode
repaired only the drafts its constraint refuses). Re-run one at a time from three of the weakest models trained
there, they took 2.13, 2.26 and 3.33 (post-train-stages-avx2-zen3-vm.json). Three dogfood runs
reserving 3.5 there used 3.28, 2.44 and 2.58 and ended 61-147 s inside the budget (-reserve35-*.json), and with
packed weights for decoding 2.62 and 2.46 (-pack-*.json). Those runs asked the server for the parity stage's 8
answers one at a time (about 57 s there); batched, the same 8 take about 18 s
(bench/results/served-batch-speed-avx2-zen3-vm.json), about half a base evaluation less, so 3.0 covers what 3.5
did. What the reserve leaves over goes unused at the end of the command; stages that run past it may still use the
margin that the run's re-fitted length leaves below its time limit (mens.train.schedule.REFIT_TARGET). Runs with
3.0: docs/benchmarks.md, "An AVX2-only CPU (Zen 3)". A plan that trains most of the recipe reserves
POST_TRAIN_FACTOR_TRAINED instead."""
POST_TRAIN_FACTOR_TRAINED = 2.0
"""The stages after training against the base model's evaluation where the plan trains at least TRAINED_SHARE of
the recipe's steps: a well-trained model answers briefly and rarely needs a retry or a repair, so those stages cost
less than after a short run, and the larger factor there would leave training time unused at the end of every run.
The runs behind both factors: docs/benchmarks.md, "The reserve by the share of the recipe trained"
(bench/results/post-train-stages-by-share-vm.json)."""
TRAINED_SHARE = 0.65
"""Planned share of the recipe's steps from which POST_TRAIN_FACTOR_TRAINED is reserved."""
POST_TRAIN_STAGES = ("eval-tuned", "gate", "merge", "parity", "card")
"""The stages after training, which the reserve pays for."""
POST_TRAIN_FIXED_S = 30.0
"""Merge, model card and report, whatever the task count."""
SAFETY = 0.92
"""Share of the computed training time that the probe's plan fills: step times drift (thermal, memory, other
processes). The plan is where the run starts; it re-fits its length to the time limit as it goes (at 20% of the
planned steps first), so this only keeps the first stretch of the schedule from planning too long."""
MIN_STEPS = 20
VAL_PASSES = 1
"""Validation-loss passes in a budgeted run: one, at the end, over RUN_VAL_SHARE of the rows. Dogfood decides nothing
on a mid-run value, so that time goes to training instead."""


LAUNCHED_AT_ENV = "MENS_LAUNCHED_AT"
"""Unix time at which `scripts/mens` started, before it built or checked the virtual environment."""
MAX_LAUNCH_S = 3600.0
"""A launch time further back than this is not this command's (a variable left in a shell), and is ignored."""


def since_launch(now: float, environ: Mapping[str, str]) -> float | None:
    """Seconds since `scripts/mens` started this command, or None when it did not (or the value is not sane)."""
    try:
        seconds = now - float(environ.get(LAUNCHED_AT_ENV, ""))
    except ValueError:
        return None
    return seconds if 0.0 <= seconds <= MAX_LAUNCH_S else None


def parse_budget(text: str | None) -> float | None:
    """Seconds from `30m`, `1h`, `1h30m`, `90s` or plain seconds; None for `none`/`off`/empty (no budget)."""
    if text is None or str(text).strip().lower() in ("", "none", "off", "0"):
        return None
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", raw)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != raw.replace(" ", ""):
        raise UsageError(f"--budget {text!r}: expected a duration such as 30m, 1h, 1h30m, 900s, or none")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@dataclass
class Probe:
    """What a few steps of the real recipe cost on this machine."""

    step_s: float
    """Median seconds per optimizer step after the first."""
    val_s: float
    """Seconds for one whole validation pass: the probe's pass over PROBE_VAL_SHARE of the rows, scaled by tokens."""
    startup_s: float
    """Loading the model and data, building the optimizer: paid once per training run."""
    recipe_steps: int
    """Steps the recipe would train without a budget (epochs x steps per epoch, or its max_steps)."""
    tokens_per_s: float | None = None
    others_cores: float | None = None
    """Cores that other processes kept busy while the probe ran (None where it cannot be read): a step time
    measured beside another job plans fewer steps than the quiet machine would train."""
    steps_per_epoch: int | None = None
    """Optimizer steps in one pass over the data (where `eval.eval_every` is "epoch", its validation passes)."""


@dataclass
class BudgetPlan:
    budget_s: float
    elapsed_s: float
    """Wall time of the stages before training, the probe included."""
    reserve_s: float
    """Estimated wall time of the stages after training: `reserve_factor` base evaluations and POST_TRAIN_FIXED_S."""
    reserve_factor: float
    train_s: float
    """What is left for the training run itself."""
    steps: int
    """The steps planned from the probe; the run re-fits them to max_time_s as it goes (schedule.fit_to_time)."""
    recipe_steps: int
    max_time_s: float
    """The training loop's hard time limit: what `train_s` leaves after start-up and the final validation pass.
    The planned steps end well before it (SAFETY); it stops a run whose machine slows down mid-way (another job
    starts), so the budget still holds, at the cost of a learning-rate schedule cut short."""
    probe: Probe
    cpu: str
    native_bf16: bool
    note: str


def probe_training(tc, probe_dir: Path, steps: int = PROBE_STEPS) -> Probe:
    """Train `steps` optimizer steps of `tc` into `probe_dir` (thrown away after) and time them."""
    import copy
    import shutil

    from mens.train.run import run_training
    from mens.train.telemetry import read_events

    cfg = copy.deepcopy(tc)
    cfg.output_dir, cfg.max_steps, cfg.eval_every, cfg.save_every = str(probe_dir), steps, 0, 0
    cfg.resume, cfg.log_every_s = False, 3600.0
    shutil.rmtree(probe_dir, ignore_errors=True)
    before = cpu_snapshot()
    summary = run_training(cfg, val_share=PROBE_VAL_SHARE)
    others = others_cores(before, cpu_snapshot())
    events = read_events(probe_dir)
    start = next(e for e in events if e.get("event") == "train_start")
    step_events = [e for e in events if e.get("event") == "step"]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(step_events, step_events[1:], strict=False)]
    step_s = statistics.median(times) if times else summary["train_time_s"] / max(1, summary["steps"])
    # The final validation pass runs after the last step, inside the timed loop, over a share of the rows.
    val_s = max(0.0, summary["train_time_s"] - (step_events[-1]["elapsed_s"] if step_events else 0.0))
    evals = [e for e in events if e.get("event") == "eval"]
    if evals and evals[-1].get("tokens"):
        val_s *= evals[-1]["all_tokens"] / evals[-1]["tokens"]
    recipe = tc.max_steps if tc.max_steps else max(1, math.ceil(tc.epochs * start["steps_per_epoch"]))
    shutil.rmtree(probe_dir, ignore_errors=True)
    return Probe(step_s=round(step_s, 3), val_s=round(val_s, 2),
                 startup_s=round(summary["wall_time_s"] - summary["train_time_s"], 2), recipe_steps=recipe,
                 tokens_per_s=summary.get("tokens_per_s"), others_cores=others,
                 steps_per_epoch=start.get("steps_per_epoch"))


def reserve_factor(planned_share: float) -> float:
    """Base evaluations reserved for the stages after training, for a plan that trains `planned_share` of the
    recipe's steps."""
    return POST_TRAIN_FACTOR_TRAINED if planned_share >= TRAINED_SHARE else POST_TRAIN_FACTOR


def post_train_reserve(base_eval_s: float, planned_share: float) -> float:
    """Seconds reserved for the stages after training, from the base model's greedy evaluation time."""
    return reserve_factor(planned_share) * base_eval_s + POST_TRAIN_FIXED_S


def _fit_steps(train_s: float, probe: Probe) -> int:
    """Probe steps that fill SAFETY of `train_s` after start-up and the final validation pass."""
    final_val_s = RUN_VAL_SHARE * probe.val_s  # probe.val_s is a whole pass, scaled from the probe's share
    usable = SAFETY * train_s - probe.startup_s - VAL_PASSES * final_val_s
    return int(usable // probe.step_s) if probe.step_s > 0 else probe.recipe_steps


def plan_budget(budget_s: float, elapsed_s: float, base_eval_s: float, probe: Probe, *, cpu: str = "",
                native_bf16: bool = False) -> BudgetPlan:
    """The steps that fit: pure arithmetic over the measurements, so it is tested without training.

    The reserve depends on how much of the recipe the plan trains (`reserve_factor`), and that on the reserve: the
    plan is made with the smaller reserve first and kept where it trains at least TRAINED_SHARE of the recipe;
    otherwise it is made a second time with the larger one (which trains fewer steps still)."""
    share = 1.0
    fit = _fit_steps(budget_s - elapsed_s - post_train_reserve(base_eval_s, share), probe)
    if min(probe.recipe_steps, fit) < TRAINED_SHARE * probe.recipe_steps:  # a weaker model: the larger reserve
        share = fit / probe.recipe_steps
        fit = _fit_steps(budget_s - elapsed_s - post_train_reserve(base_eval_s, share), probe)
    reserve = post_train_reserve(base_eval_s, share)
    train_s = budget_s - elapsed_s - reserve
    final_val_s = RUN_VAL_SHARE * probe.val_s
    steps = min(probe.recipe_steps, fit)
    how = f"{probe.step_s:.2f} s/step measured over {PROBE_STEPS - 1} probe steps"
    if steps < min(MIN_STEPS, probe.recipe_steps):  # a recipe shorter than MIN_STEPS only has to fit whole
        raise UsageError(
            f"--budget {budget_s / 60:.0f}m leaves {max(0.0, train_s) / 60:.1f} min for training after "
            f"{elapsed_s / 60:.1f} min of data stages and {reserve / 60:.1f} min reserved for evaluation: "
            f"{max(0, fit)} steps at {how}, fewer than {MIN_STEPS}; give a longer --budget (or --budget none)")
    if steps < probe.recipe_steps:
        note = (f"{steps} of the recipe's {probe.recipe_steps} steps fit {train_s / 60:.1f} min of training "
                f"({how}; {elapsed_s / 60:.1f} min spent before training, {reserve / 60:.1f} min reserved after: "
                f"{reserve_factor(share):g} base evaluations and {POST_TRAIN_FIXED_S:.0f} s)")
    else:
        note = f"the recipe's {steps} steps fit the budget ({how})"
    if probe.others_cores is not None and probe.others_cores >= BUSY_CORES:
        note += (f"; other processes kept {probe.others_cores:.1f} cores busy while the probe ran, so a quiet "
                 "machine trains more steps in this budget")
    return BudgetPlan(budget_s=budget_s, elapsed_s=round(elapsed_s, 1), reserve_s=round(reserve, 1),
                      reserve_factor=reserve_factor(share),
                      train_s=round(train_s, 1), steps=steps, recipe_steps=probe.recipe_steps,
                      max_time_s=round(max(probe.step_s * MIN_STEPS, train_s - probe.startup_s - final_val_s), 1),
                      probe=probe, cpu=cpu,
                      native_bf16=native_bf16, note=note)


def mean_step_s(step_elapsed: list[float]) -> float | None:
    """A run's mean seconds per step from its step events' `elapsed_s` (in order), the first step left out
    (warm-up). A resumed run's clock starts again: the step where it drops back is left out the same way."""
    gaps = [b - a for a, b in zip(step_elapsed, step_elapsed[1:], strict=False) if b >= a]
    return sum(gaps) / len(gaps) if gaps else None


def whole_recipe_train_s(probe: Mapping, step_s: float, eval_every: int | str) -> float:
    """Seconds the training stage of the recipe's whole length (`--budget none`) would take on this machine:
    start-up, every step at `step_s` (the budgeted run's own mean) and the recipe's validation passes (every
    `eval_every` steps, or at each epoch's end for "epoch", and at the end), each as long as the probe measured
    one."""
    steps = int(probe["recipe_steps"])
    every = probe.get("steps_per_epoch") if eval_every == "epoch" else int(eval_every)
    passes = steps // every + (steps % every != 0) if every else 1
    return float(probe["startup_s"]) + steps * step_s + passes * float(probe["val_s"])


def whole_recipe(plan: Mapping, trained_steps: int, train_stage_s: float, stages_s: float) -> dict | None:
    """For the summary of a run the budget cut: the steps trained of the recipe's, and about how long the whole
    command would take with `--budget none` here: the stages as they took, with the training stage (the probe
    included) replaced by `whole_recipe_train_s`. None when the budget fitted the whole recipe or the run wrote
    no estimate."""
    whole = plan.get("whole_recipe")
    recipe = int(plan.get("recipe_steps") or 0)
    if not isinstance(whole, Mapping) or not whole.get("train_s") or trained_steps >= recipe:
        return None
    return {"budget_s": plan.get("budget_s"), "steps": trained_steps, "recipe_steps": recipe,
            "step_s": whole.get("step_s"),
            "whole_recipe_s": round(stages_s - train_stage_s + float(whole["train_s"]), 1)}


BUSY_CORES = 0.5
"""Other processes' load, in cores, from which the plan's note says the machine was not quiet. Two torch jobs on
the same cores each run a thread per core, and each slows the other by more than its share."""


@dataclass
class CpuSnapshot:
    """Busy time of the CPUs this process may run on, and this process's own CPU time, at one moment."""

    wall_s: float
    busy_s: float
    own_s: float


def busy_seconds(stat_text: str, cpus: set[int], ticks_per_s: float) -> float:
    """Seconds the listed CPUs spent busy (user, nice, system, irq, softirq) since boot, from /proc/stat's text.
    Steal (the hypervisor's other guests) and idle/iowait are not counted: they are no process's on this machine."""
    total = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        fields = [int(x) for x in rest.split()]
        total += sum(fields[i] for i in (0, 1, 2, 5, 6) if i < len(fields))
    return total / ticks_per_s


def cpu_snapshot() -> CpuSnapshot | None:
    """This moment's reading (Linux); None where /proc/stat or the CPU affinity cannot be read."""
    try:
        cpus = os.sched_getaffinity(0)
        busy = busy_seconds(Path("/proc/stat").read_text(encoding="utf-8"), cpus, os.sysconf("SC_CLK_TCK"))
    except (OSError, AttributeError, ValueError):
        return None
    t = os.times()
    return CpuSnapshot(wall_s=time.monotonic(), busy_s=busy, own_s=t.user + t.system)


def others_cores(before: CpuSnapshot | None, after: CpuSnapshot | None) -> float | None:
    """Mean cores kept busy by other processes between two readings: busy time not spent by this process."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    other = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return round(max(0.0, other) / (after.wall_s - before.wall_s), 2)


def write_plan(plan: BudgetPlan, path: Path) -> None:
    write_json(path, asdict(plan))  # atomic: a resumed run keeps the plan it reads back


def cpu_name() -> str:
    """The CPU's model name (Linux), for the plan record; empty elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
