"""Two dogfood records paired task by task: which tasks an arm gained and lost against its base, per split.

Totals hide how much moved: +1 can be 1 task gained, or 6 gained and 5 lost. For each split that both records list
failed tasks for (the held-out split, and `features` where read; bench/dogfood.py never lists the confirmation
split's), this prints the tasks gained and lost and an exact two-sided sign test on them (McNemar's test: under "no
effect" a task that moved is equally likely to move either way). Several base/arm pairs (one per seed) are summed
as well, since the per-seed pairs are the recipe's evidence.
Run: `python bench/paired_tasks.py BASE.json ARM.json [BASE2.json ARM2.json ...] [--json OUT]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import comb
from pathlib import Path

SPLITS = ("heldout", "features")


def _failed(rec: dict, split: str) -> dict[str, str] | None:
    part = rec if split == "heldout" else rec.get(split)
    return None if not isinstance(part, dict) else part.get("failed_tasks")


def sign_test_p(gained: int, lost: int) -> float:
    """Exact two-sided p of a sign test: the chance of a split at least this uneven among gained + lost moves."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def pair(base: dict, arm: dict) -> dict:
    """Tasks gained and lost by `arm` against `base`, per split both records list."""
    out = {}
    for split in SPLITS:
        b, a = _failed(base, split), _failed(arm, split)
        if b is None or a is None:
            continue
        gained, lost = sorted(set(b) - set(a)), sorted(set(a) - set(b))
        out[split] = {"gained": gained, "lost": lost, "net": len(gained) - len(lost),
                      "sign_test_p": round(sign_test_p(len(gained), len(lost)), 4)}
    return out


def summed(pairs: list[dict]) -> dict:
    """Gained and lost counted over every pair, per split that each pair holds (other keys are ignored)."""
    out = {}
    for split in SPLITS:
        if not pairs or not all(split in p for p in pairs):
            continue
        g = sum(len(p[split]["gained"]) for p in pairs)
        lo = sum(len(p[split]["lost"]) for p in pairs)
        out[split] = {"gained": g, "lost": lo, "net": g - lo, "sign_test_p": round(sign_test_p(g, lo), 4)}
    return out


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"bench/paired_tasks.py: cannot read {path} as a dogfood record ({e}); pass the JSON "
                         "that bench/dogfood.py wrote") from None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="BASE ARM pairs of dogfood records, one pair per seed")
    ap.add_argument("--json", type=Path, help="Also write the comparison here.")
    args = ap.parse_args(argv)
    if len(args.records) % 2:
        ap.error(f"records come in BASE ARM pairs; got {len(args.records)} paths")
    recs = [_load(p) for p in args.records]
    pairs = []
    for i in range(0, len(recs), 2):
        (bp, base), (ap_, arm) = (args.records[i], recs[i]), (args.records[i + 1], recs[i + 1])
        if base.get("seed") != arm.get("seed"):
            raise SystemExit(f"bench/paired_tasks.py: {bp} is seed {base.get('seed')} and {ap_} seed "
                             f"{arm.get('seed')}; pair runs of the same seed")
        p = pair(base, arm)
        if not p:
            raise SystemExit(f"bench/paired_tasks.py: {bp} and {ap_} do not both list failed tasks; records "
                             "written by bench/dogfood.py before it listed them cannot be paired task by task")
        pairs.append({"base": str(bp), "arm": str(ap_), "seed": base.get("seed"), **p})
        for split in SPLITS:
            if split in p:
                q = p[split]
                print(f"seed {base.get('seed')} {split}: net {q['net']:+d} (gained {len(q['gained'])}: "
                      f"{', '.join(q['gained']) or '-'}; lost {len(q['lost'])}: {', '.join(q['lost']) or '-'}); "
                      f"sign test p {q['sign_test_p']}")
    total = summed(pairs)
    for split, q in total.items():
        print(f"all seeds {split}: net {q['net']:+d} (gained {q['gained']}, lost {q['lost']}); "
              f"sign test p {q['sign_test_p']}")
    result = {"pairs": pairs, "summed": total}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
