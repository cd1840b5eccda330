"""Merge parity by teacher forcing against decoding every answer again, on a finished dogfood run.

The parity stage checks the merged model on the adapter's greedy answers by teacher forcing
(`HFEngine.adopt_greedy`) and decodes only those it cannot show. This times both ways on the same loaded merged
model, alternating (`--rounds`), and checks that each adopted answer is the answer decoding gives; for each refused
one it says why (the text tokenizes to other ids than the model chose, or a near tie). Writes
bench/results/parity-speed-<host>.json. Run: `python bench/parity_speed.py --from-dir DIR [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import REPO, machine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR` (merge done).")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/parity-speed-<host>.json).")
    args = ap.parse_args()

    import torch

    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.evaluate.run import greedy_requests
    from mens.lang import get_language
    from mens.model.batch_decode import TIE_MARGIN
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference

    config, _run, adapter = finished_run(args.from_dir)
    tasks = finished_tasks(args.from_dir, config)
    answers = {r["id"]: r["samples"][0]["output"] for r in adapter}
    tasks = [t for t in tasks if t.id in answers]
    requests = greedy_requests(tasks, config["max_new_tokens"])
    loaded = load_for_inference(args.from_dir / "merged", device=config.get("device", "auto"))
    lang = get_language("vox")
    times: dict[str, list[float]] = {"decode_all": [], "teacher_forced": [], "teacher_forced_then_decode_rest": []}
    decoded, kept = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        decoded = HFEngine(loaded, lang).generate_batch(requests)
        times["decode_all"].append(time.perf_counter() - t0)
        engine = HFEngine(loaded, lang)
        t0 = time.perf_counter()
        kept = engine.adopt_greedy(requests, [answers[t.id] for t in tasks])
        times["teacher_forced"].append(time.perf_counter() - t0)
        engine.generate_batch(requests)
        times["teacher_forced_then_decode_rest"].append(time.perf_counter() - t0)
    wrong = [t.id for t, k, d in zip(tasks, kept, decoded, strict=True) if k and d != answers[t.id]]
    tok = loaded.tokenizer
    refused = []
    prompt_ids = HFEngine(loaded, lang).prompt_ids
    for task, k, request, answer in zip(tasks, kept, requests, decoded, strict=True):
        if k:
            continue
        text = answers[task.id]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        prompt = prompt_ids(request)
        with torch.no_grad():
            logits = loaded.model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        top = logits.topk(2, dim=-1)
        first = next((j for j in range(len(ids)) if int(top.indices[j, 0]) != ids[j]), None)
        gap = float((top.values[:, 0] - top.values[:, 1]).min()) if len(ids) else None
        refused.append({"id": task.id, "decoded_equals_adapter": answer == text,
                        "first_other_choice_at": first, "smallest_gap": gap,
                        "why": "the model chose other ids for the same text" if first is not None
                        else f"a gap under {TIE_MARGIN}" if gap is not None and gap < TIE_MARGIN else "how it ends"})
    doc = {"bench": "parity_speed", **machine(), "torch_threads": torch.get_num_threads(),
           "run_dir": str(args.from_dir), "seed": config.get("seed"), "tasks": len(tasks),
           "max_new_tokens": config["max_new_tokens"],
           "rounds": args.rounds, "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
           "speedup_median": round(statistics.median(times["decode_all"])
                                   / statistics.median(times["teacher_forced_then_decode_rest"]), 2),
           "adopted": sum(kept), "adopted_but_decoded_differently": wrong, "refused": refused}
    path = args.output or REPO / "bench" / "results" / f"parity-speed-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"adopted {sum(kept)}/{len(tasks)} (decoded differently: {len(wrong)}); decode all "
          f"{doc['seconds']['decode_all']} s, teacher forcing then the rest "
          f"{doc['seconds']['teacher_forced_then_decode_rest']} s: {doc['speedup_median']}x\nwrote {path}")


if __name__ == "__main__":
    main()
