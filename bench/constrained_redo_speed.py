"""Constrained evaluation repairing refused drafts from the draft, against decoding them again from scratch.

In eval-local's constrained mode a greedy draft that the constraint accepts is the answer; each refused one is
decoded again with the constraint, one token at a time. Greedy constrained decoding keeps the model's choice
wherever it is viable, so it follows the draft up to its first repair: with the draft given (`stream_tokens`'s
`draft`), the model runs from there on only. On a finished dogfood run this times the tuned model's constrained
mode on the held-out tasks both ways, alternating (`--rounds`), from the same kept greedy drafts (decoded once,
untimed, as eval-tuned's greedy mode leaves them), and checks that both ways give the same answers and scores.
Writes bench/results/constrained-redo-<host>.json.
Run: `python bench/constrained_redo_speed.py --from-dir DIR [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine

ARMS = ("from_draft", "from_scratch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR`.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/constrained-redo-<host>.json).")
    args = ap.parse_args()

    import torch

    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.evaluate.local import evaluate_model
    from mens.evaluate.run import greedy_requests
    from mens.lang import get_language
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference

    config, run, _adapter = finished_run(args.from_dir)
    tasks = finished_tasks(args.from_dir, config)
    tokens = config["max_new_tokens"]
    lang = get_language("vox")
    tuned = load_for_inference(run, device=config.get("device", "auto"))
    drafts = HFEngine(tuned, lang)
    drafts.generate_batch(greedy_requests(tasks, tokens))  # kept: what eval-tuned's greedy mode leaves
    steps: list[int] = []
    tuned.model.register_forward_hook(lambda *_: steps.append(1))

    def engine(arm: str) -> tuple[HFEngine, list[int]]:
        """A fresh engine holding the kept drafts; from_scratch hands its redos no draft (the decoder before)."""
        e = HFEngine(tuned, lang)
        e._greedy = dict(drafts._greedy)
        redone: list[int] = []
        stream = e._stream

        def redo(request, usage, draft=None):
            redone.append(len(draft or []))
            return stream(request, usage, draft if arm == "from_draft" else None)

        e._stream = redo
        return e, redone

    seconds: dict[str, list[float]] = {a: [] for a in ARMS}
    model_steps: dict[str, list[int]] = {a: [] for a in ARMS}
    outputs: dict[str, list[str]] = {}
    scores: dict[str, dict] = {}
    redone_draft_tokens: list[int] = []
    for r in range(args.rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            e, redone = engine(arm)
            steps.clear()
            t0 = time.perf_counter()
            report = evaluate_model(e, tasks, lang, modes=["constrained"], k=1, max_new_tokens=tokens)
            seconds[arm].append(round(time.perf_counter() - t0, 2))
            model_steps[arm].append(len(steps))
            redone_draft_tokens = redone
            outputs.setdefault(arm, [s["output"] for row in report["results"] for s in row["samples"]])
            scores[arm] = {k: report["metrics"][k] for k in ("nonempty_parse_rate", "pass_at_1")}
            print(f"round {r + 1} {arm}: {seconds[arm][-1]:.1f} s, {model_steps[arm][-1]} model steps, "
                  f"{len(redone)} drafts repaired", flush=True)
    same = sum(a == b for a, b in zip(outputs["from_draft"], outputs["from_scratch"], strict=True))
    speedup = round(statistics.median(seconds["from_scratch"]) / statistics.median(seconds["from_draft"]), 2)
    doc = {"bench": "constrained_redo_speed", **machine(), "torch_threads": torch.get_num_threads(),
           "run_dir": str(args.from_dir), "seed": config.get("seed"), "tasks": len(tasks), "max_new_tokens": tokens,
           "rounds": args.rounds,
           "arms": {"from_draft": "each refused draft repaired from the draft (the model runs from its first repair)",
                    "from_scratch": "each refused draft decoded again from its prompt, one token at a time"},
           "drafts_repaired": len(redone_draft_tokens), "draft_tokens_of_repaired": redone_draft_tokens,
           "seconds": seconds, "model_steps": model_steps, "speedup_median": speedup,
           "same_answers": f"{same} of {len(outputs['from_draft'])}", "scores": scores}
    path = args.output or REPO / "bench" / "results" / f"constrained-redo-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: doc[k] for k in ("seconds", "model_steps", "speedup_median", "same_answers", "scores")},
                     indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
