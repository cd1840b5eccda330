"""Vox parse speed: lex+parse every shared-corpus .vox file and ```vox doc block several times; report lines/s.

Run: `python bench/parse_speed.py [--rounds N] [--corpus DIR]`; writes bench/results/parse_speed-<host>.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from machine import machine  # noqa: E402

from mens.lang.vox import parse  # noqa: E402


def doc_blocks(md_text: str) -> list[str]:
    lines = md_text.split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```vox":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            out.append("\n".join(lines[i + 1 : j]) + "\n")
            i = j + 1
        else:
            i += 1
    return out


def load_corpus(root: Path) -> list[str]:
    texts = [p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*.vox*")) if p.is_file()]
    for md in sorted((root / "docs").rglob("*.md")):
        texts.extend(doc_blocks(md.read_text(encoding="utf-8")))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus" / "vox")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    texts = load_corpus(args.corpus)
    n_lines = sum(t.count("\n") + (not t.endswith("\n")) for t in texts)
    n_bytes = sum(len(t.encode()) for t in texts)
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        ok = sum(parse(t).ok for t in texts)
        times.append(time.perf_counter() - t0)
    best = min(times)
    result = {
        "benchmark": "vox_parse_speed",
        "inputs": len(texts), "lines": n_lines, "bytes": n_bytes, "parse_ok": ok, "rounds": args.rounds,
        "seconds_per_round": [round(t, 4) for t in times], "best_seconds": round(best, 4),
        "lines_per_second": round(n_lines / best),
        "median_lines_per_second": round(n_lines / sorted(times)[len(times) // 2]),
        "machine": machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"parse_speed-{socket.gethostname()}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(texts)} inputs, {n_lines} lines: best {best:.3f}s -> {result['lines_per_second']:,} lines/s ({path})")


if __name__ == "__main__":
    main()
