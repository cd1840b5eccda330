"""Benchmark: the whole corpus pipeline (extract -> validate -> pairs -> eval, plus generate and mix) over the
shared Vox corpus; seconds per stage, records/s, and the machine. Goal: under 10 s end to end.

Run: `.venv/bin/python bench/corpus_pipeline.py [--shared ../shared/corpus/vox]`
Writes bench/results/corpus_pipeline-<hostname>.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from machine import machine  # noqa: E402

from mens.corpus.eval import eval_to_file  # noqa: E402
from mens.corpus.extract import extract_to_file  # noqa: E402
from mens.corpus.generate import generate_to_file  # noqa: E402
from mens.corpus.mix import mix_sources  # noqa: E402
from mens.corpus.pairs import build_pairs  # noqa: E402
from mens.corpus.validate import validate_file  # noqa: E402


def _timed(stages: dict, name: str, n_records: int, fn):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    stages[name] = {"seconds": round(dt, 4), "records": n_records if isinstance(n_records, int) else n_records(out),
                    "records_per_s": None}
    rec = stages[name]["records"]
    stages[name]["records_per_s"] = round(rec / dt, 1) if dt > 0 else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "corpus" / "vox")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    stages: dict = {}
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        t0 = time.perf_counter()
        ex = _timed(stages, "extract", lambda r: r.units_new,
                    lambda: extract_to_file([args.shared / "examples", args.shared / "docs"], d / "units.jsonl"))
        va = _timed(stages, "validate", ex.units_new,
                    lambda: validate_file(d / "units.jsonl", d / "validated.jsonl", d / "rejects.jsonl"))
        pa = _timed(stages, "pairs", va.n_kept,
                    lambda: build_pairs(d / "validated.jsonl", d / "train.jsonl", multi_turn=True))
        ev = _timed(stages, "eval", pa.n_pairs, lambda: eval_to_file(d / "train.jsonl", d / "eval.json"))
        core = time.perf_counter() - t0
        _timed(stages, "generate", 500, lambda: generate_to_file(d / "synthetic.jsonl", 500, seed=0))
        (d / "mix.yaml").write_text("sources:\n  - {path: train.jsonl, weight: 2}\n"
                                    "  - {path: synthetic.jsonl, weight: 0.5, sample_rate: 0.5}\noutput: mixed.jsonl\n")
        mx = _timed(stages, "mix", lambda r: r["total_emitted"], lambda: mix_sources(d / "mix.yaml", base=d))
        total = time.perf_counter() - t0
    result = {
        "benchmark": "corpus_pipeline", "machine": machine(),
        "corpus": str(args.shared), "stages": stages,
        "counts": {"units": ex.units_new, "kept": va.n_kept, "rejected": dict(va.rejected), "pairs": pa.n_pairs,
                   "parse_rate": ev["parse_rate"], "nonempty_parse_rate": ev["nonempty_parse_rate"],
                   "construct_coverage_pct": ev["construct_coverage_pct"], "mixed_rows": mx["total_emitted"]},
        "seconds_extract_to_eval": round(core, 3), "seconds_total": round(total, 3), "goal_seconds": 10.0,
        "goal_met": total < 10.0, "timestamp_unix": int(time.time()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"corpus_pipeline-{socket.gethostname()}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, s in stages.items():
        print(f"{name:9s} {s['seconds']:7.3f} s  {s['records']:6d} records  {s['records_per_s']} rec/s")
    print(f"extract->eval {core:.3f} s, total {total:.3f} s (goal < 10 s) -> {path}")


if __name__ == "__main__":
    main()
