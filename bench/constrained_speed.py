"""Constrained decoding speed: tokens/s with and without the Vox constraint, alternating on the same prompts.

Each round decodes every prompt twice with the same greedy settings, once unconstrained and once with
`language_constraint(vox)`, the order swapped every round so that neither side always runs on a warmer cache or a
quieter machine. It reports tokens/s per side (tokens decoded / wall seconds, summed over the prompts of a round),
their ratio per round and the median ratio, the ratio of each prompt's two back-to-back answers (less exposed to
other jobs' bursts), how often the constrained answer is the unconstrained one token for
token, when its first streamed piece arrived, and how the prefix checker reached its verdicts.

Run: `python bench/constrained_speed.py [--model DIR] [--bench FILE] [--tasks N] [--rounds R]`; writes
bench/results/constrained_speed-<host>[-<label>].json. `--src DIR` imports mens from another source tree (e.g. an
export of an earlier commit, `git archive HEAD | tar -x -C /tmp/before`) to measure the decoder before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOGFOOD = Path("/tmp/fc/dogfood")


def cpu_flags() -> list[str]:
    """The /proc/cpuinfo flags that decide CPU matmul speed (AVX2, AVX-512, bf16, AMX)."""
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))


def decode(model, tok, ids, constraint, max_new_tokens, temperature=0.0, seed=0):
    """One answer: (text, tokens, seconds, seconds to the first streamed piece, pieces)."""
    from mens.model.generate import code_block_closed, stream_tokens

    tokens: list[int] = []
    pieces: list[str] = []
    first = None
    t0 = time.perf_counter()
    for piece in stream_tokens(model, tok, ids, max_new_tokens=max_new_tokens, constraint=constraint,
                               temperature=temperature, seed=seed, on_token=tokens.append,
                               stop_text=None if constraint else code_block_closed):
        if first is None:
            first = time.perf_counter() - t0
        pieces.append(piece)
    return "".join(pieces), tokens, time.perf_counter() - t0, first, len(pieces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DOGFOOD / "merged", help="merged model or run directory")
    ap.add_argument("--bench", type=Path, default=DOGFOOD / "bench" / "heldout.jsonl", help="held-out tasks")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling")
    ap.add_argument("--max-candidates", type=int, default=None, help="candidates the constraint may try per step")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--src", type=Path, default=REPO / "src", help="the mens source tree to measure")
    ap.add_argument("--label", default="", help="suffix of the result file name (e.g. before)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    sys.path.insert(0, str(args.src))
    import torch

    from mens.lang import get_language
    from mens.model.constraint import language_constraint
    from mens.model.generate import chat_input_ids
    from mens.model.inference import load_for_inference

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    loaded = load_for_inference(args.model, device="cpu")
    tasks = [json.loads(line) for line in args.bench.read_text(encoding="utf-8").splitlines() if line.strip()]
    tasks = tasks[: args.tasks]
    prompts = [chat_input_ids(loaded.tokenizer, [{"role": "user", "content": t["prompt"]}], loaded.system_prompt)
               for t in tasks]
    vox = get_language("vox")
    decode(loaded.model, loaded.tokenizer, prompts[0], None, 8)  # warm-up: first-call allocations
    rounds, answers, paired = [], {}, []
    firsts: dict[str, list[float]] = {"free": [], "constrained": []}
    pieces_seen: dict[str, list[int]] = {"free": [], "constrained": []}
    for r in range(args.rounds):
        sides = {"free": {"tokens": 0, "seconds": 0.0}, "constrained": {"tokens": 0, "seconds": 0.0}}
        for i, ids in enumerate(prompts):
            order = ("free", "constrained") if (r + i) % 2 == 0 else ("constrained", "free")
            speed = {}
            for side in order:
                constraint = language_constraint(vox) if side == "constrained" else None
                if constraint is not None and args.max_candidates:
                    constraint.max_candidates = args.max_candidates
                text, toks, secs, first, n_pieces = decode(loaded.model, loaded.tokenizer, ids, constraint,
                                                           args.max_new_tokens, args.temperature, 1000 * r + i)
                firsts[side].append(first if first is not None else secs)
                pieces_seen[side].append(n_pieces)
                sides[side]["tokens"] += len(toks)
                sides[side]["seconds"] += secs
                speed[side] = len(toks) / secs
                row = answers.setdefault(tasks[i]["id"], {})
                row[side] = {"text": text, "tokens": toks, "seconds_to_first_piece": first, "pieces": n_pieces}
                counts = getattr(constraint.viable, "counts", None) if constraint else None
                if counts:
                    row.setdefault("checker_counts", {k: 0 for k in counts})
                    for k, v in counts.items():
                        row["checker_counts"][k] += v
            paired.append(speed["constrained"] / speed["free"])  # the same prompt, back to back
        tps = {s: v["tokens"] / v["seconds"] for s, v in sides.items()}
        rounds.append({"tokens": {s: v["tokens"] for s, v in sides.items()},
                       "seconds": {s: round(v["seconds"], 3) for s, v in sides.items()},
                       "tokens_per_s": {s: round(v, 2) for s, v in tps.items()},
                       "ratio_constrained_over_free": round(tps["constrained"] / tps["free"], 4)})
        print(f"round {r + 1}/{args.rounds}: free {tps['free']:.2f} tok/s, constrained {tps['constrained']:.2f} "
              f"tok/s, ratio {tps['constrained'] / tps['free']:.3f}", flush=True)
    ratios = [x["ratio_constrained_over_free"] for x in rounds]
    same = sum(a["free"]["tokens"] == a["constrained"]["tokens"] for a in answers.values())
    same_text = sum(a["free"]["text"].strip() == a["constrained"]["text"].strip() for a in answers.values())
    parses = sum(vox.parse(a["constrained"]["text"]).has_code for a in answers.values())
    free_parses = sum(vox.parse(a["free"]["text"]).has_code for a in answers.values())
    checker = {}
    for a in answers.values():
        for k, v in a.get("checker_counts", {}).items():
            checker[k] = checker.get(k, 0) + v
    import mens.model.generate as generate_module

    result = {
        "benchmark": "constrained_decoding_speed",
        "model": str(args.model), "bench": str(args.bench), "tasks": len(tasks), "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "decoding": "greedy" if args.temperature <= 0 else f"sampled at {args.temperature} (seed 1000*round+prompt)",
        "max_candidates": args.max_candidates or "default", "torch_threads": torch.get_num_threads(),
        "src": str(args.src), "decoder": generate_module.__file__,
        "rounds_detail": rounds,
        "median_ratio_constrained_over_free": statistics.median(ratios),
        "median_overhead_percent": round((1 / statistics.median(ratios) - 1) * 100, 1),
        "paired_prompt_ratios": {"median": round(statistics.median(paired), 4),
                                 "quartiles": [round(q, 4) for q in statistics.quantiles(paired, n=4)],
                                 "n": len(paired)},
        "answers_same_tokens": f"{same}/{len(answers)}", "answers_same_text": f"{same_text}/{len(answers)}",
        "constrained_parse": f"{parses}/{len(answers)}", "free_parse": f"{free_parses}/{len(answers)}",
        "median_seconds_to_first_piece": {s: round(statistics.median(v), 3) for s, v in firsts.items()},
        "median_pieces_per_answer": {s: statistics.median(v) for s, v in pieces_seen.items()},
        "checker_verdicts_all_rounds": checker or None,
        "answers": {k: {s: a[s]["text"] for s in ("free", "constrained")} for k, a in answers.items()},
        "machine": {"host": socket.gethostname(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
                    "flags": cpu_flags(), "torch": torch.__version__},
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "timing_note": "both sides alternate per prompt and round, so the ratio is the figure to quote; "
                       "load_average_before_after says how busy the CPUs were around the run",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"constrained_speed-{socket.gethostname()}{'-' + args.label if args.label else ''}.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"median ratio {result['median_ratio_constrained_over_free']:.3f} "
          f"(overhead {result['median_overhead_percent']}%), same answers {same}/{len(answers)}, "
          f"constrained parse {parses}/{len(answers)} -> {args.out / name}")


def _cpu_name() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return ""


if __name__ == "__main__":
    main()
