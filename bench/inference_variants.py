"""A finished dogfood run's greedy answers under inference-only variants, paired on the same trained weights.

Dogfood trains with a one-line system prompt (`mens.dogfood.pipeline.SHORT_SYSTEM_PROMPT`); `mens train` packages a
~270-token one that describes the language (`mens.train.text.default_system_prompt`). Two questions that need no
training run to answer, because each variant answers with the weights the run trained:
- `packaged_prompt`: does a model trained with the short prompt answer better when handed the long one at inference?
- `scaled_<s>`: does moving the weights part of the way back to the base (the LoRA update times `--scale`, as WiSE-FT
  interpolates fine-tuned and pre-trained weights for robustness to new inputs) do better on another writer's tasks?
Each variant and the run as trained (`trained`) answer the held-out split and the documented-features split
(bench/features) greedy, with the run's token limit; each split lists the tasks that passed, so variants pair task by
task, and counts the answers that reached the token limit.
Writes bench/results/inference-variants-<host>.json. Run: `python bench/inference_variants.py --from-dir DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from machine import REPO, commit, machine

from mens.run_records import read_json

FEATURES = REPO / "bench" / "features" / "vox_features.jsonl"


def scaled_copy(run: Path, scale: float, into: Path) -> Path:
    """A copy of `run` whose LoRA update is `scale` times the trained one: peft scales each update by its alpha over
    r (or sqrt(r) with rsLoRA), so adapter_config.json's alphas, per-module ones included, are multiplied by `scale`
    and nothing else changes. Checkpoints are left out."""
    dest = into / run.name
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("checkpoints"))
    cfg_path = dest / "adapter_config.json"
    cfg = read_json(cfg_path)
    cfg["lora_alpha"] = cfg["lora_alpha"] * scale
    cfg["alpha_pattern"] = {k: v * scale for k, v in (cfg.get("alpha_pattern") or {}).items()}
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return dest


def evaluate(loaded, bench: str | None, split: str, max_new_tokens: int) -> dict:
    """Greedy answers of a loaded model (`mens.model.inference.LoadedModel`, with the system prompt it carries) to a
    bench split, through a fresh engine (so no answer is reused from another variant)."""
    from mens.evaluate.bench import load_bench
    from mens.evaluate.local import evaluate_model, select_tasks
    from mens.lang import get_language
    from mens.model.hf_engine import HFEngine

    lang = get_language("vox")
    tasks = select_tasks(load_bench(bench), split, None)
    started = time.perf_counter()
    report = evaluate_model(HFEngine(loaded, lang), tasks, lang, modes=["greedy"], k=1, max_new_tokens=max_new_tokens)
    tok = loaded.tokenizer
    lengths = [len(tok(r["samples"][0]["output"], add_special_tokens=False)["input_ids"]) for r in report["results"]]
    m = report["metrics"]
    return {"tasks": m["tasks"], "nonempty_parse_rate": m["nonempty_parse_rate"], "pass_at_1": m["pass_at_1"],
            "passed": sorted(r["id"] for r in report["results"] if r["pass_at_1"] > 0),
            "failures_by_category": m.get("failures_by_category"),
            # an answer this long was cut by the limit (or stopped exactly at it)
            "answers_at_limit": sum(n >= max_new_tokens for n in lengths),
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR`.")
    ap.add_argument("--scale", type=float, default=0.85, help="The LoRA update's scale in the scaled variant.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/inference-variants-<host>.json).")
    ap.add_argument("--note", help="What the record is for.")
    args = ap.parse_args()

    from mens.model.inference import load_for_inference
    from mens.train.text import default_system_prompt

    state = read_json(args.from_dir / "dogfood_state.json")
    run = Path(read_json(args.from_dir / "dogfood_summary.json")["run"])
    max_new_tokens = state["config"]["max_new_tokens"]
    splits = {"heldout": (state["config"].get("bench"), "heldout"), "features": (str(FEATURES), "all")}
    variants: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trained = load_for_inference(run, device="cpu")  # each model loaded once, for every split it answers
        scaled = load_for_inference(scaled_copy(run, args.scale, Path(tmp)), device="cpu")
        for name, loaded in (("trained", trained),
                             ("packaged_prompt", dataclasses.replace(trained, system_prompt=default_system_prompt())),
                             (f"scaled_{args.scale:g}", scaled)):
            variants[name] = {}
            for split_name, (bench, split) in splits.items():
                variants[name][split_name] = evaluate(loaded, bench, split, max_new_tokens)
                print(f"{name} {split_name}: {len(variants[name][split_name]['passed'])} passed", flush=True)
    result = {"bench": "inference_variants", **machine(), "commit": commit(), "seed": state["config"]["seed"],
              **({"note": args.note} if args.note else {}), "run": str(run), "max_new_tokens": max_new_tokens,
              "scale": args.scale, "variants": variants}
    out = args.output or REPO / "bench" / "results" / f"inference-variants-{result['host']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
