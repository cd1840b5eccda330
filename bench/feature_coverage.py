"""Which of the language's keywords and decorators the documentation uses, and how often a training file does.

The question it answers: does the training data cover the documented language as a whole, or only the parts a
bench's tasks happen to ask for? A model that saw a feature in a handful of answers rarely uses it when a fresh
task asks for it. The documented language here is what the upstream docs and examples show in current code:
the units of `mens corpus extract` over them that parse, are training-eligible and carry no doc-test skip marker
such as `// vox:skip` (planned syntax; `mens corpus validate` drops the same units). A feature is one of the
language's fixed lexical words (`Language.feature_kinds`: Vox's keywords and decorators), counted once per sample
that uses it as a token (`mens corpus eval`'s `feature_counts`). Builtin names that are plain identifiers (layout
elements, standard library calls) are not features here.

The record lists every documented feature with its documented units and training samples, and those under
`--floor` training samples: where new training requests would widen coverage. Choose them from this list, never
from a bench split's failures (bench/confirm/ says why).

Run:  python bench/feature_coverage.py --train RUN/data/train.jsonl [--corpus PATH ...] [--floor 10] [--output P]
      (default corpus: ../shared/corpus/vox/docs and .../examples; writes bench/results/feature_coverage-<host>.json)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mens.corpus.eval import evaluate_file  # noqa: E402  (no torch: the corpus layer)
from mens.corpus.extract import extract_to_file  # noqa: E402

SHARED = REPO.parent / "shared" / "corpus" / "vox"
DEFAULT_CORPUS = (SHARED / "docs", SHARED / "examples")


def coverage(train: Path, corpus: list[Path], floor: int) -> dict:
    """Documented features (in parsing corpus units) against the training file's samples that use each."""
    with tempfile.TemporaryDirectory(prefix="mens-features-") as tmp:
        units = Path(tmp) / "units.jsonl"
        extract_to_file(corpus, units, "vox", rejects=Path(tmp) / "rejects.jsonl")
        current = Path(tmp) / "current.jsonl"  # what validate keeps: no doc-test skip marker, training-eligible
        rows = [json.loads(line) for line in units.read_text(encoding="utf-8").splitlines() if line.strip()]
        current.write_text("".join(json.dumps(r) + "\n" for r in rows if not r.get("skip_markers")
                                   and r.get("training_eligible") is not False), encoding="utf-8")
        documented = evaluate_file(current, "vox")
    trained = evaluate_file(train, "vox")
    docs, used = documented["feature_counts"], trained["feature_counts"]
    table = {f: {"documented_units": docs[f], "train_samples": used.get(f, 0)}
             for f in sorted(docs, key=lambda f: (used.get(f, 0), -docs[f], f))}
    return {"corpus_units": documented["code_samples"], "corpus_units_parsing": round(
                documented["parse_rate"] * documented["code_samples"]),
            "train_samples": trained["code_samples"], "floor": floor,
            "documented_features": len(docs), "documented_and_trained": sum(1 for f in docs if used.get(f)),
            "under_floor": [f for f, row in table.items() if row["train_samples"] < floor],
            "trained_not_documented": sorted(f for f in used if f not in docs),
            "features": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=Path, required=True, help="A training file (a dogfood run's data/train.jsonl).")
    ap.add_argument("--corpus", type=Path, nargs="*", default=list(DEFAULT_CORPUS),
                    help="Docs and source folders that define the documented language (default: the shared "
                         "corpus's docs and examples).")
    ap.add_argument("--floor", type=int, default=10, help="Training samples a documented feature should reach.")
    ap.add_argument("--output", type=Path, help="Result JSON (default bench/results/feature_coverage-<host>.json).")
    a = ap.parse_args()
    missing = [str(p) for p in [a.train, *a.corpus] if not p.exists()]
    if missing:
        sys.exit(f"not found: {', '.join(missing)} (--train: a training JSONL; --corpus: docs/source folders)")
    record = {"bench": "feature_coverage", "train": str(a.train),
              "train_sha256": hashlib.sha256(a.train.read_bytes()).hexdigest(), "corpus": [str(p) for p in a.corpus],
              **coverage(a.train, a.corpus, a.floor)}
    out = a.output or REPO / "bench" / "results" / f"feature_coverage-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{record['documented_and_trained']} of {record['documented_features']} documented features in training; "
          f"under {a.floor} samples: {', '.join(record['under_floor']) or 'none'}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
