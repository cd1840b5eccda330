"""`mens corpus generate --tasks`: task-shaped synthetic pairs that teach a model to do what was asked.

Each template in `data/generate/vox_tasks.yaml` is a small bench task: prompt phrasings that name the declarations,
their kinds and signatures (in plain Vox words and in request words Vox does not have, such as "action", "loader",
"page" or "enum"), the code that answers it, and an `expect` (the bench's Expect fields). All three are filled with
the same seeded random values. A pair is written only when its code parses and passes `check_output` against its own
expect, so every row is a worked example of the check the bench applies. `focus` weights template categories, and
`focus_from_results` derives such weights from a `benchmark_results.json`, so a second round can aim at failures.
No torch.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from mens.corpus.frontend import base_kinds, resolve_language
from mens.corpus.generate import load_templates
from mens.corpus.jsonl import write_jsonl
from mens.corpus.jsonrow import check_file_size, parse_json_value
from mens.corpus.limits import MAX_JSONL_FILE_BYTES
from mens.corpus.records import codegen_row
from mens.errors import DataError, UsageError
from mens.lang.checks import Expect, check_output

MAX_TRIES = 20
FAILED_TASK_BOOST = 4.0
"""focus_from_results: a category's weight is 1 + FAILED_TASK_BOOST * (share of its tasks that failed)."""

# Bench categories -> template categories of vox_tasks.yaml (identity where the names agree).
BENCH_TO_TEMPLATE: dict[str, list[str]] = {
    "fn": ["fn"], "type": ["type"], "table": ["table"], "endpoint": ["endpoint"], "test": ["test", "forall"],
    "forall": ["forall"], "component": ["component"], "fragment": ["fragment"], "routes": ["routes"],
    "mcp": ["mcp"], "actor": ["actor"], "state_machine": ["state_machine"], "scheduled": ["scheduled"],
    "form": ["form"], "import": ["import"], "let_const": ["let_const"], "effects": ["effects"],
    "match": ["match"], "program": ["program"], "contracts": ["contracts"], "loading": ["loading"],
    "url": ["url"],
}
# Failure categories of checks.py that say "did not do what was asked"; a task failing only on these still counts,
# and they add a little extra weight to the program-shaped templates that train several named declarations at once.
_INSTRUCTION_FAILURES = {"kind", "name", "params", "returns", "contents"}


@dataclass
class TaskGenReport:
    """What the task generator wrote and what it never wrote (and why)."""

    written: int = 0
    rejected_unparsable: int = 0
    rejected_expect: int = 0
    rejected_heldout_name: int = 0
    duplicates: int = 0
    templates: int = 0
    categories: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    """The first few rejections (template kind and reason), to fix a template quickly."""

    def summary(self) -> str:
        cats = ", ".join(f"{c} {n}" for c, n in self.categories.most_common())
        return (f"wrote {self.written} task pairs from {self.templates} templates ({len(self.categories)} categories, "
                f"{len(self.kinds)} construct kinds); never written: {self.rejected_unparsable} that did not parse, "
                f"{self.rejected_expect} that failed their own expect, {self.rejected_heldout_name} that drew a "
                f"held-out task's name, {self.duplicates} duplicates\n"
                f"categories: {cats}")


def load_task_templates(language: str) -> dict:
    """`data/generate/<language>_tasks.yaml` (the same loader and cache as the program templates)."""
    return load_templates(language, suffix="_tasks")


def _pascal(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def _values(data: dict, rng: random.Random) -> dict:
    """One draw of every shared placeholder; templates pick what they need."""
    (e_cls, e, es), (e2_cls, e2, es2) = rng.sample(data["entities"], 2)
    nf, nf2 = rng.sample(data["int_fields"], 2)
    sf, sf2 = rng.sample(data["str_fields"], 2)
    bf, ff = rng.choice(data["bool_fields"]), rng.choice(data["float_fields"])
    n, n2, big = rng.randint(2, 9), rng.randint(2, 9), rng.randint(10, 99)
    word = rng.choice(data["words"])
    v = {"E": e_cls, "e": e, "es": es, "E2": e2_cls, "e2": e2, "es2": es2, "EU": e.upper(),
         "nf": nf, "nf2": nf2, "NFU": nf.upper(), "nf_pascal": _pascal(nf), "sf": sf, "sf2": sf2,
         "bf": bf, "bf_pascal": _pascal(bf), "ff": ff, "n": n, "n2": n2, "big": big,
         "sum": n + n2, "prod": n * n2, "dbl": 2 * n, "word": word, "Word": word.capitalize()}
    for key in ("calc", "make", "drop", "upd", "list", "show", "fetch", "adj", "ui", "lst", "cron"):
        v[key] = rng.choice(data[key])
    return {k: str(x) for k, x in v.items()}


def _fill(obj, values: dict):
    """Substitute placeholders in every string (dict keys included) of a YAML structure."""
    if isinstance(obj, str):
        return Template(obj).substitute(values)
    if isinstance(obj, list):
        return [_fill(x, values) for x in obj]
    if isinstance(obj, dict):
        return {_fill(k, values): _fill(x, values) for k, x in obj.items()}
    return obj


def _instance(tpl: dict, data: dict, rng: random.Random) -> tuple[str, str, dict]:
    """(prompt, code, expect) of one template, all filled with the same values."""
    values = _values(data, rng)
    # Template names are filled in order, so a later name may build on an earlier one.
    for key, choice in (tpl.get("names") or {}).items():
        values[key] = _fill(rng.choice(choice) if isinstance(choice, list) else choice, values)
    prompt = _fill(rng.choice(tpl["prompts"]), values)
    return prompt, _fill(tpl["code"], values), _fill(tpl.get("expect") or {}, values)


def _pick(templates: list[dict], focus: dict[str, float] | None, credit: list[float]) -> int:
    """Smooth weighted round robin: deterministic, every weighted template is visited, shares follow the weights.

    A template's weight is the focus weight of its kind, else of its category, else 1.
    """
    weights = [_weight(t, focus) for t in templates]
    total = sum(weights)
    for i, w in enumerate(weights):
        credit[i] += w
    best = max(range(len(templates)), key=lambda i: credit[i])
    credit[best] -= total
    return best


def _weight(tpl: dict, focus: dict[str, float] | None) -> float:
    if not focus:
        return 1.0
    return float(focus.get(tpl["kind"], focus.get(tpl["category"], 1.0)))


def generate_task_pairs(limit: int, seed: int = 0, focus: dict[str, float] | None = None, language: str | None = None,
                        *, avoid_names: frozenset[str]) -> tuple[list[dict], TaskGenReport]:
    """`limit` task pairs that parse and pass their own expect; deterministic for a seed (and focus).

    `avoid_names`: names no pair may declare, the held-out tasks' (`mens.evaluate.bench.heldout_names()`); required,
    so that no caller forgets them: random composition can hit one (Order + Status), and such a pair teaches the bench.
    """
    if limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    if focus and any(w < 0 for w in focus.values()):
        raise UsageError(f"focus weights must be >= 0, got {focus}")
    lang = resolve_language(language)
    data = load_task_templates(lang.name)
    templates = data["templates"]
    if focus and not any(_weight(t, focus) > 0 for t in templates):
        raise UsageError("focus gives every template weight 0; give at least one category a positive weight")
    rng = random.Random(seed)
    report, rows, seen = TaskGenReport(templates=len(templates)), [], set()
    credit = [0.0] * len(templates)
    for i in range(limit):
        tpl = templates[_pick(templates, focus, credit)]
        row = _make_row(tpl, data, rng, lang, seen, report, avoid_names, f"taskgen:seed={seed}:{i}:{tpl['kind']}")
        if row is not None:
            rows.append(row)
    report.written = len(rows)
    return rows, report


def _make_row(tpl: dict, data: dict, rng: random.Random, lang, seen: set, report: TaskGenReport,
              avoid_names: frozenset[str], source: str) -> dict | None:
    """One checked row of `tpl`, retrying on duplicates and rejections; None when every try failed."""
    for _ in range(MAX_TRIES):
        prompt, code, expect = _instance(tpl, data, rng)
        if code in seen:
            report.duplicates += 1
            continue
        wanted = Expect(**expect)
        if wanted.declared_names() & avoid_names:
            report.rejected_heldout_name += 1
            continue
        res = lang.parse(code)
        if not res.has_code:
            report.rejected_unparsable += 1
            _note(report, tpl, f"does not parse: {res.first_error}")
            continue
        check = check_output(code, wanted, lang)
        if not check.passed:
            report.rejected_expect += 1
            _note(report, tpl, "; ".join(r for _, r in check.failures))
            continue
        seen.add(code)
        kinds = base_kinds(lang, res.decls)
        report.kinds.update(kinds)
        report.categories[tpl["category"]] += 1
        return codegen_row(lang.name, prompt, code, category=f"{lang.name}_task_{tpl['category']}", rating=3,
                           source=source, origin="synthetic", constructs=kinds, expect=expect)
    return None


def _note(report: TaskGenReport, tpl: dict, reason: str) -> None:
    if len(report.failures) < 10:
        report.failures.append(f"{tpl['kind']}: {reason}")


def _list(value) -> list:
    return value if isinstance(value, list) else []


def focus_from_results(benchmark_results: dict) -> dict[str, float]:
    """Template-category weights from a `mens eval-local` benchmark_results.json: failing categories weigh more.

    A bench category's weight is 1 + FAILED_TASK_BOOST * (share of its tasks with a failed sample); failures of
    the "did not do what was asked" kind (kind, name, params, ...) in any category also lift the `program` templates,
    which train several named declarations at once.
    """
    results = benchmark_results.get("results") if isinstance(benchmark_results, dict) else None
    if not isinstance(results, list):
        raise DataError("benchmark results: expected a JSON object with a 'results' list (from mens eval-local)")
    tasks, failed, instruction = Counter(), Counter(), 0
    for r in results:
        if not isinstance(r, dict):
            continue  # not a task result; the file was edited or is not from mens eval-local
        cat = str(r.get("category") or "general")
        samples = [s for s in _list(r.get("samples")) if isinstance(s, dict)]
        tasks[cat] += 1
        bad = [s for s in samples if not s.get("pass")]
        if bad:
            failed[cat] += 1
            reasons = {str(f.get("category")) for s in bad for f in _list(s.get("failures")) if isinstance(f, dict)}
            instruction += bool(reasons & _INSTRUCTION_FAILURES)
    weights: dict[str, float] = {}
    for cat, n in tasks.items():
        w = 1.0 + FAILED_TASK_BOOST * failed[cat] / n
        for tcat in BENCH_TO_TEMPLATE.get(cat, []):
            weights[tcat] = max(weights.get(tcat, 1.0), w)
    if instruction and results:
        weights["program"] = weights.get("program", 1.0) + instruction / len(results)
    return {k: round(v, 4) for k, v in sorted(weights.items())}


def load_focus(path: Path) -> dict[str, float]:
    """focus_from_results of a benchmark_results.json file."""
    try:
        check_file_size(path, MAX_JSONL_FILE_BYTES, "benchmark results file")
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise DataError(f"--focus {path}: cannot read it ({e.strerror}); pass a benchmark_results.json") from None
    except UnicodeDecodeError as e:
        raise DataError(f"--focus {path}: not UTF-8 (byte {e.start}); pass a benchmark_results.json") from None
    doc, problem = parse_json_value(text)
    if problem:
        raise DataError(f"--focus {path}: {problem}; pass a benchmark_results.json written by mens eval-local")
    return focus_from_results(doc)


def generate_tasks_to_file(out: Path, limit: int, seed: int = 0, focus: dict[str, float] | None = None,
                           language: str | None = None, *, avoid_names: frozenset[str]) -> TaskGenReport:
    rows, report = generate_task_pairs(limit, seed, focus, language, avoid_names=avoid_names)
    write_jsonl(out, rows)
    return report
