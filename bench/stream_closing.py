"""How long a constrained stream waits: the prefixes of real answers that no closing closes, narrow and wide.

Constrained decoding streams text only up to points a closing suffix closes (mens.model.generate), so a prefix
with none holds the stream back until a later one has one. For every character prefix of each answer's code this
counts prefixes with no `closing_suffix` (the narrow one, which also decides when a model may stop) and with no
`stream_closing_suffix` (the wider one that decides streaming), the longest run of such prefixes per answer (the
longest wait, in characters), and the parses each costs per character.
Run:  python bench/stream_closing.py --data DIR_OR_JSONL [--answers 80] [--out bench/results/stream_closing.json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from pathlib import Path

from machine import REPO, machine

from mens.lang.vox import complete, parse

FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def answers(path: Path, n: int, seed: int) -> list[str]:
    """Up to n code answers (the fenced block where there is one) of a train.jsonl, in a seeded random order."""
    path = path / "train.jsonl" if path.is_dir() else path
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    codes = []
    for row in rows:
        text = row.get("response") or ""
        m = FENCE.search(text)
        code = m.group(1) if m else text
        if code.strip():
            codes.append(code)
    return codes[:n]


def measure(codes: list[str], closing) -> dict:
    calls = 0

    def parses(text: str) -> bool:
        nonlocal calls
        calls += 1
        return parse(text).has_code

    t0, held, prefixes, longest = time.perf_counter(), 0, 0, []
    for code in codes:
        run = worst = 0
        for i in range(1, len(code) + 1):
            prefixes += 1
            if closing(code[:i], parses) is None:
                held, run = held + 1, run + 1
                worst = max(worst, run)
            else:
                run = 0
        longest.append(worst)
    longest.sort()
    return {"held_share": round(held / prefixes, 4), "longest_wait_chars": {
        "median": statistics.median(longest), "p90": longest[int(0.9 * (len(longest) - 1))], "max": longest[-1]},
        "parses_per_char": round(calls / prefixes, 2), "seconds": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a train.jsonl, or a directory holding one")
    ap.add_argument("--answers", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "stream_closing.json")
    a = ap.parse_args(argv)
    codes = answers(a.data, a.answers, a.seed)
    doc = {"bench": "stream_closing", "machine": machine(), "data": str(a.data), "answers": len(codes),
           "characters": sum(map(len, codes)), "narrow": measure(codes, complete.closing_suffix),
           "wide": measure(codes, complete.stream_closing_suffix)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("answers", "narrow", "wide")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
