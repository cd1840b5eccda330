"""CPU decoding with the linear layers' weights packed for oneDNN, against torch's default matmul.

`load_for_inference` packs each f32 linear layer's weight once into oneDNN's layout on CPU
(`mens.model.cpu_linear`): a decoding step multiplies a few rows by every weight, where torch's default BLAS repacks
the weight on each call. On a finished dogfood run this times, alternating (`--rounds`), the held-out tasks' greedy
answers of the base model (dogfood's base eval) and of the tuned model (its greedy pass), each on a model loaded
packed and one loaded plain; then the tuned eval's three modes (greedy, parse-and-retry, constrained) once each way;
and one decoding step at 1, 4, 16 and 60 rows each way. It checks that both ways give the same answers.
Writes bench/results/cpu-decode-kernels-<host>.json.
Run: `python bench/cpu_decode_kernels.py --from-dir DIR [--rounds 2] [--note TEXT]`.
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
    ap.add_argument("--from-dir", type=Path, required=True, help="A finished `mens dogfood -o DIR`.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--note", default="")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/cpu-decode-kernels-<host>.json).")
    args = ap.parse_args()

    import torch

    from mens.dogfood.parity import finished_run, finished_tasks
    from mens.evaluate.local import evaluate_model
    from mens.evaluate.run import greedy_requests
    from mens.lang import get_language
    from mens.model import cpu_linear
    from mens.model.hf_engine import HFEngine
    from mens.model.inference import load_for_inference, resolve_base

    if not cpu_linear.packing_available():
        raise SystemExit("this torch build has no oneDNN: nothing to compare")
    config, run, _adapter = finished_run(args.from_dir)
    tasks = finished_tasks(args.from_dir, config)
    tokens = config["max_new_tokens"]
    requests = greedy_requests(tasks, tokens)
    lang = get_language("vox")
    pack = cpu_linear.pack_linears

    def load(path, packed: bool):
        cpu_linear.pack_linears = pack if packed else (lambda model: 0)
        try:
            return load_for_inference(path, device="cpu")
        finally:
            cpu_linear.pack_linears = pack

    base_dir = resolve_base(run)[0]
    models = {(name, way): load(path, way == "packed") for name, path in (("base", base_dir), ("tuned", run))
              for way in ("packed", "plain")}
    for way in ("packed", "plain"):
        models[("base", way)].system_prompt = models[("tuned", way)].system_prompt  # as dogfood's base eval
    packed_layers = sum("forward" in vars(m) for m in models[("tuned", "packed")].model.modules())

    seconds: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for r in range(args.rounds):
        for name in ("base", "tuned"):
            for way in ("packed", "plain") if r % 2 == 0 else ("plain", "packed"):
                engine = HFEngine(models[(name, way)], lang)
                t0 = time.perf_counter()
                answers.setdefault(name, {})[way] = engine.generate_batch(requests)
                seconds.setdefault(f"{name}_greedy", {}).setdefault(way, []).append(round(time.perf_counter() - t0, 2))
    modes: dict[str, dict] = {}
    for way in ("packed", "plain"):
        report = evaluate_model(HFEngine(models[("tuned", way)], lang), tasks, lang,
                                modes=["greedy", "retry", "constrained"], k=1, max_new_tokens=tokens)
        modes[way] = {m: {"seconds": v["seconds"], "pass_at_1": v["pass_at_1"],
                          "nonempty_parse_rate": v["nonempty_parse_rate"]} for m, v in report["modes"].items()}

    step_ms: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        vocab = min(1000, models[("tuned", "packed")].model.get_input_embeddings().num_embeddings)
        for rows in (1, 4, 16, 60):
            ids = torch.randint(0, vocab, (rows, 100), generator=torch.Generator().manual_seed(rows))
            for way in ("packed", "plain"):
                model = models[("tuned", way)].model
                past = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
                step = ids[:, -1:]
                times = []
                for _ in range(8):
                    t0 = time.perf_counter()
                    past = model(input_ids=step, past_key_values=past, use_cache=True, logits_to_keep=1).past_key_values
                    times.append(time.perf_counter() - t0)
                step_ms.setdefault(str(rows), {})[way] = round(statistics.median(times[2:]) * 1000, 1)

    same = {m: sum(a == b for a, b in zip(w["packed"], w["plain"], strict=True)) for m, w in answers.items()}
    speedup = {k: round(statistics.median(v["plain"]) / statistics.median(v["packed"]), 2) for k, v in seconds.items()}
    doc = {"bench": "cpu_decode_kernels", **machine(), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "run_dir": str(args.from_dir), "seed": config.get("seed"),
           "tasks": len(tasks), "max_new_tokens": tokens, "rounds": args.rounds, "packed_layers": packed_layers,
           "seconds": seconds, "speedup_median": speedup, "same_answers": same,
           "tuned_eval_modes": modes,
           "tuned_eval_modes_seconds": {w: round(sum(m["seconds"] for m in v.values()), 2) for w, v in modes.items()},
           "tuned_step_ms_by_rows": step_ms,
           "note": args.note or "packed: every f32 linear layer's weight packed once for oneDNN's linear kernel "
                                "(mens.model.cpu_linear, load_for_inference's default on CPU); plain: torch's "
                                "default matmul; greedy rounds alternate the order; step_ms: one decoding step of "
                                "the tuned model after a 100-token prompt, median of 6"}
    path = args.output or REPO / "bench" / "results" / f"cpu-decode-kernels-{doc['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: doc[k] for k in ("seconds", "speedup_median", "same_answers", "tuned_eval_modes_seconds",
                                          "tuned_step_ms_by_rows")}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
