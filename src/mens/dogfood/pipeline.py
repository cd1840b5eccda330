"""`mens dogfood`: the embedded Vox corpus to a fine-tuned, evaluated, gated, merged assistant, end to end.

Stages run in order, each reading the files of the stages before it and writing its own under the output
directory; `dogfood_state.json` records what finished (and how long it took), so `--resume` skips done
stages and a failed stage keeps everything before it. Run: `mens dogfood [--quick] [-o runs/dogfood]`.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from mens.errors import GateFailed, UsageError
from mens.run_records import (
    BENCHMARK,
    BUDGET,
    DOGFOOD_STATE,
    DOGFOOD_SUMMARY,
    GATE_RECEIPT,
    MERGE_PARITY,
    MODEL_CARD,
    REPORT,
    SUMMARY,
    BenchmarkResults,
    DogfoodSummary,
    GateReceipt,
    MergeParity,
    read_json,
    write_json,
)

DEFAULT_BUDGET = "30m"
"""`mens dogfood`'s wall-clock budget when none is given (`--budget none`: the whole recipe, however long this machine
takes). How much of the recipe it trains on which CPU, and what that scores: docs/benchmarks.md, "A 30-minute
budget"."""
SHORT_SYSTEM_PROMPT = "You are an expert Vox programmer. Answer with valid, current Vox code only."
"""The first line of the packaged prompt. The full one is ~270 tokens, four times a typical pair: on CPU it
would cost most of the training time, for a gain not measured; dogfood trains, evaluates and serves
with this one (stored in the run's manifest, so eval, merge and serve reuse it). A model trained with it answers
worse when handed the full one at inference (docs/benchmarks.md, "Inference-only variants")."""


SIZES = {"synthetic": 50, "tasks": 0, "repairs": 0, "tasks2": 400, "limit": None, "served_tasks": 8,
         "max_new_tokens": 200}
"""Dogfood's own sizes in a full run; --quick takes its sizes from the preset mens/configs/dogfood/quick.yaml."""
OWN_TRAIN_KEYS = ("output_dir", "data.path", "model.name", "device", "seed", "data.system_prompt",
                  "checkpoint.resume", "adapter.init_adapter")
"""Training keys dogfood sets itself (from its own fields and stages); a `train:` override of one is refused."""


@dataclass
class DogfoodConfig:
    output_dir: Path
    model: str = "smollm2-135m"
    corpus: list[Path] = field(default_factory=list)
    """Extra sources (a Vox checkout's examples/ and docs/) added to the embedded corpus."""
    quick: bool = False
    """A smoke run of every stage: the preset mens/configs/dogfood/quick.yaml (training overrides and sizes)."""
    device: str = "auto"
    train: dict = field(default_factory=dict)
    """Training overrides, keys as in the training config (nested, or dotted: `{"schedule.max_steps": 50}`,
    `{"preset": "cpu"}`): over the device's preset (or the one named here) and --quick's block."""
    synthetic: int | None = None
    """Synthetic programs from `corpus generate` (default 50; quick 40)."""
    tasks: int | None = None
    """Task-shaped pairs from `corpus generate --tasks` (default 0 = none; quick 60): templates with a few
    phrasings each. The hand-written requests took most of their share of the training budget
    (bench/results/recipe_seeds-requests-vm.json), and in paired runs the last 150 cost more than they gave on
    the held-out and features splits (docs/benchmarks.md, "Template task pairs")."""
    repairs: int | None = None
    """Repair pairs (mens.corpus.repairs): a shipped request's answer broken by one edit the parser rejects, asked
    to be fixed (default 0 = none: 150 of them did not pass the bar for the default, docs/benchmarks.md)."""
    bench: str = "vox_default"
    split: str = "heldout"
    limit: int | None = None
    """Evaluate only the first N held-out tasks (quick: 8)."""
    max_new_tokens: int | None = None
    modes: tuple[str, ...] = ("greedy", "retry", "constrained")
    rounds: int = 1
    """2 adds a data loop: the round-1 model answers the bench's dev split, task pairs aimed at the categories it
    failed are generated, and training continues from the round-1 adapter (the held-out split stays unseen)."""
    dev_pairs: bool | None = None
    """Train on the bench's dev split (its tasks with their reference answers, each repeated
    mens.dogfood.stages.DEV_REPEATS times). Default: yes with one round; no with --rounds 2, whose data loop probes
    the model on the dev split (it must stay unseen there)."""
    renamed_dev: bool = False
    """Each dev-split pair's repeats after the first are renamed copies (mens.corpus.rename): the names the request
    gives, changed alike in the request and the answer, so the model learns to take names from the request."""
    requests: bool = True
    """Train on the hand-written requests shipped with the language (`mens.corpus.requests`), repeated
    REQUEST_REPEATS times."""
    tasks2: int | None = None
    """Focused task pairs for round 2 (default 400; quick 40)."""
    served_tasks: int | None = None
    """How many held-out prompts are also sent to the real server in the parity stage (default 8; quick 2)."""
    gates: Path | None = None
    """Gate YAML; None = the packaged dogfood gates; the string "none" skips the gate stage."""
    system_prompt: str = SHORT_SYSTEM_PROMPT
    seed: int = 0
    resume: bool = False
    budget: str | None = None
    """Wall-clock budget for the whole run (`30m`, `1h`): training gets the steps that fit, measured on this
    machine by a few probe steps (mens.dogfood.budget); `none` = the recipe's own length, however long it takes.
    Unset: DEFAULT_BUDGET for a full one-round run whose length the user did not set; none for --quick,
    --rounds 2 or a run given --epochs/--max-steps."""

    def __post_init__(self) -> None:
        from mens.train.resolve import check_layer

        self.output_dir = Path(self.output_dir)
        preset = quick_preset() if self.quick else {}
        for name, default in SIZES.items():
            if getattr(self, name) is None:
                setattr(self, name, preset.get(name, default))
        if self.rounds not in (1, 2):
            raise UsageError(f"--rounds {self.rounds}: use 1 or 2")
        if self.dev_pairs is None:
            self.dev_pairs = self.rounds == 1
        if self.renamed_dev and not self.dev_pairs:
            raise UsageError("--renamed-dev renames the repeats of the dev split's pairs, which this run leaves out "
                             "(--no-dev-pairs, or --rounds 2); drop --renamed-dev or add --dev-pairs")
        if self.budget is None:
            self.budget = self.default_budget()
        if self.budget is not None:
            from mens.dogfood.budget import parse_budget

            if parse_budget(self.budget) is not None and self.rounds == 2:
                raise UsageError("--budget fits one training run to the time; with --rounds 2 leave it out")
        self.train = check_layer(self.train or {}, "dogfood train overrides")
        if own := [k for k in OWN_TRAIN_KEYS if _has(self.train, k)]:
            raise UsageError(f"dogfood train overrides: {', '.join(own)} are set by dogfood itself (its data, run "
                             "directories and stages); use `mens dogfood --model/--device/--seed` instead")

    def default_budget(self) -> str | None:
        """The budget of a run that names none: DEFAULT_BUDGET, unless it is a smoke run (--quick), a data loop
        (--rounds 2) or its length was asked for (--epochs / --max-steps)."""
        asked = any(has_setting(self.train or {}, k) for k in ("schedule.max_steps", "schedule.epochs"))
        return None if self.quick or self.rounds == 2 or asked else DEFAULT_BUDGET

    @property
    def gate_enforced(self) -> bool:
        """--quick is a smoke run of every stage: 20 steps are not meant to reach the bar, so with the packaged gates
        an unmet gate is recorded (gate_receipt.json, card) but does not stop merge and parity. --gates enforces."""
        return not (self.quick and self.gates is None)

    def train_overrides(self) -> dict:
        """The training overrides of every round: --quick's block, then the user's (an epochs count given without a
        step count replaces --quick's step count)."""
        from mens.train.resolve import merge

        base = copy.deepcopy(quick_preset().get("train", {})) if self.quick else {}
        if _has(self.train, "schedule.epochs") and not _has(self.train, "schedule.max_steps"):
            base.get("schedule", {}).pop("max_steps", None)
        return merge(base, self.train)


def quick_preset() -> dict:
    """The --quick preset: `train:` overrides (checked) and dogfood's sizes."""
    from mens.train.presets import read_yaml_mapping
    from mens.train.resolve import check_layer

    where = "mens/configs/dogfood/quick.yaml"
    data = read_yaml_mapping(None, where, resources.files("mens.configs").joinpath("dogfood", "quick.yaml")
                             .read_text(encoding="utf-8"))
    if unknown := set(data) - {"train", *SIZES}:
        raise UsageError(f"{where}: unknown keys {sorted(unknown)}; expected train: and {', '.join(SIZES)}")
    return {**data, "train": check_layer(data.get("train") or {}, where)}


def has_setting(tree: dict, path: str) -> bool:
    """Whether a `train:` block sets `path` (`optimizer.learning_rate`), nested or as a dotted key."""
    return _has(tree, path) or path in tree or path.rsplit(".", 1)[-1] in tree


def _has(tree: dict, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


@dataclass
class Context:
    cfg: DogfoodConfig
    log: Callable[[str], None]
    notes: dict = field(default_factory=dict)
    """Per-stage one-line results, kept in the state file and the summary."""

    def path(self, *parts: str) -> Path:
        return self.cfg.output_dir.joinpath(*parts)

    @property
    def run_dir1(self) -> Path:
        return self.path("run")

    @property
    def run(self) -> Path:
        """The run that is gated, merged and carded: the last round's."""
        return self.path("run2" if self.cfg.rounds == 2 else "run")


class Pipeline:
    """The ordered stages; `run()` executes the ones not yet done and writes state after each."""

    def __init__(self, cfg: DogfoodConfig, log: Callable[[str], None] | None = None):
        from mens.dogfood import stages

        self.cfg = cfg
        self.ctx = Context(cfg, log or _stderr)
        self.stages: list[tuple[str, Callable[[Context], str]]] = [
            ("extract", stages.extract), ("validate", stages.validate), ("pairs", stages.pairs),
            ("generate", stages.generate), ("mix", stages.mix), ("heldout", stages.heldout),
            ("eval-base", stages.eval_base), ("train", stages.train), ("eval-tuned", stages.eval_tuned),
            *([("focus", stages.focus), ("train-2", stages.train_round2), ("eval-tuned-2", stages.eval_tuned_round2)]
              if cfg.rounds == 2 else []),
            ("gate", stages.gate), ("merge", stages.merge), ("parity", stages.parity), ("card", stages.card),
        ]

    def _state(self) -> dict:
        p = self.ctx.path(DOGFOOD_STATE)
        state = read_json(p) if p.is_file() else {}
        if not isinstance(state, dict):
            raise UsageError(f"{p}: expected a JSON object (the stage record); remove it or choose a new --output-dir")
        return state

    def _save(self, state: dict) -> None:
        write_json(self.ctx.path(DOGFOOD_STATE), state)

    def prepare(self) -> dict:
        out = self.cfg.output_dir
        state = self._state()
        if out.exists() and any(out.iterdir()) and not self.cfg.resume:
            raise UsageError(f"--output-dir {out} is not empty; pass --resume to continue that run (finished "
                             "stages are skipped) or choose a new directory")
        if self.cfg.resume and state.get("config") and state["config"] != _config_json(self.cfg):
            raise UsageError(f"--resume: {out / DOGFOOD_STATE} was written with other settings; rerun with the same "
                             "flags or choose a new --output-dir")
        out.mkdir(parents=True, exist_ok=True)
        state.setdefault("config", _config_json(self.cfg))
        state.setdefault("stages", {})
        return state

    def run(self) -> dict:
        """Run every stage; returns the summary. A failing stage raises after recording its error."""
        state = self.prepare()
        started = time.time()
        n = len(self.stages)
        gate_failure: GateFailed | None = None
        for i, (name, fn) in enumerate(self.stages, start=1):
            done = state["stages"].get(name, {})
            if done.get("status") == "done":
                self.ctx.log(f"[{i}/{n}] {name}: done earlier ({done.get('note', '')})")
                continue
            if name in ("merge", "parity") and gate_failure is not None:
                state["stages"][name] = {"status": "skipped", "note": "gate failed: the model is not promoted"}
                self._save(state)
                self.ctx.log(f"[{i}/{n}] {name}: skipped (gate failed)")
                continue
            self.ctx.log(f"[{i}/{n}] {name} ...")
            t0 = time.time()
            try:
                note = fn(self.ctx)
            except GateFailed as e:  # recorded; the card and report still show the verdict
                gate_failure = e
                note = f"FAILED: {e}"
            except BaseException as e:  # Ctrl+C included: the state says where the run stopped
                state["stages"][name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                                         "seconds": round(time.time() - t0, 1)}
                self._save(state)
                self.ctx.log(f"[{i}/{n}] {name} FAILED after {time.time() - t0:.0f} s; the artifacts of earlier "
                             f"stages are kept under {self.cfg.output_dir} (rerun with --resume)")
                raise
            secs = round(time.time() - t0, 1)
            state["stages"][name] = {"status": "failed" if name == "gate" and gate_failure else "done",
                                     "seconds": secs, "note": note}
            self._save(state)
            self.ctx.log(f"[{i}/{n}] {name}: {note} ({secs:.0f} s)")
        summary = self.summary(state, time.time() - started)
        if gate_failure is not None:
            raise gate_failure
        return summary

    def summary(self, state: dict, seconds: float) -> dict:
        """dogfood_summary.json: the headline numbers from the run's own files, and the stage times."""
        bench = BenchmarkResults.read_optional(self.ctx.run / BENCHMARK) or BenchmarkResults()
        round1 = BenchmarkResults.read_optional(self.ctx.path("run", BENCHMARK)) if self.cfg.rounds == 2 else None
        receipt = GateReceipt.read_optional(self.ctx.run / GATE_RECEIPT)
        parity = MergeParity.read_optional(self.ctx.run / MERGE_PARITY)
        stage_seconds = {k: v.get("seconds") for k, v in state["stages"].items()}
        out = DogfoodSummary(
            output_dir=str(self.cfg.output_dir), run=str(self.ctx.run),
            wall_time_s_this_session=round(seconds, 1),
            stage_seconds=stage_seconds,
            total_stage_seconds=round(sum(v or 0 for v in stage_seconds.values()), 1),
            base={k: (bench.base or {}).get("metrics", {}).get(k) for k in ("nonempty_parse_rate", "pass_at_1")},
            tuned={m: {k: v.get(k) for k in ("nonempty_parse_rate", "pass_at_1", "pass_at_k")}
                   for m, v in bench.modes.items()},
            gain_over_base=bench.metrics.get("gain_over_base"),
            round1=({m: {k: v.get(k) for k in ("nonempty_parse_rate", "pass_at_1")} for m, v in round1.modes.items()}
                    if round1 else None),
            gate=receipt.overall_passed if receipt else None,
            merge_parity={k: {f: v.get(f) for f in ("tasks", "same_result", "teacher_forced") if f in v}
                          for k, v in (parity.to_json() if parity else {}).items() if isinstance(v, dict)},
            merged=str(self.ctx.path("merged")), card=str(self.ctx.run / MODEL_CARD),
            report=str(self.ctx.run / REPORT),
            budget=self._budget_cut(stage_seconds),
        ).to_json()
        write_json(self.ctx.path(DOGFOOD_SUMMARY), out)
        return out

    def _budget_cut(self, stage_seconds: dict) -> dict | None:
        """The summary's `budget` block: set where the budget cut the recipe (mens.dogfood.budget.whole_recipe)."""
        from mens.dogfood.budget import whole_recipe

        plan_path = self.ctx.path("data", BUDGET)
        run_summary = self.ctx.run / SUMMARY
        summary = read_json(run_summary) if run_summary.is_file() else None
        if not plan_path.is_file() or not isinstance(summary, dict) or not summary.get("steps"):
            return None
        plan = read_json(plan_path)
        if not isinstance(plan, dict):
            return None
        return whole_recipe(plan, int(summary["steps"]), stage_seconds.get("train") or 0.0,
                            sum(v or 0 for v in stage_seconds.values()))


def _config_json(cfg: DogfoodConfig) -> dict:
    d = asdict(cfg)
    d.pop("resume")  # how the run was started, not what it computes
    return json.loads(json.dumps(d, default=str))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_dogfood(cfg: DogfoodConfig, log: Callable[[str], None] | None = None) -> dict:
    return Pipeline(cfg, log).run()
