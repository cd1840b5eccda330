"""`mens report RUN`: plots under RUN/plots/ and a one-page RUN/report.html that embeds them.

The page shows rounded numbers with the n behind every rate, the resolved hyperparameters, sample held-out answers
(passed and failed, with the reason) and the gate verdict; it is self-contained (plots inlined) so it can be sent
as one file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from mens.report.base_model import base_model_info
from mens.report.facts import (
    hyperparameters,
    num,
    rate,
    sample_answers,
    score_rows,
    served_vs_merged,
    training_numbers,
)
from mens.report.plots import plot_before_after, plot_loss, plot_modes, plot_throughput
from mens.report.runfiles import RunFiles, read_run
from mens.run_records import GATE_RECEIPT, MERGE_PARITY, PLOTS, REPORT, BenchmarkResults, GateReceipt, MergeParity

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.sub{color:#555;margin-top:0}
table{border-collapse:collapse;margin:.5em 0}
td,th{padding:4px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #e5e5e5}
th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{margin:0;white-space:pre-wrap;font-size:12px;max-height:14em;overflow:auto;background:#f8f8f8;padding:4px}
.pass{color:#17803d;font-weight:600}.fail{color:#b42318;font-weight:600}
.samples td:nth-child(2){max-width:260px}.samples td:nth-child(3){width:420px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}
img{max-width:100%}
"""


def write_plots(files: RunFiles, out: Path | None = None) -> dict[str, Path]:
    """Draw every plot the run has data for into `out` (RUN/plots by default); returns name -> path."""
    out = files.run / PLOTS if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "modes": plot_modes(files, out / "modes.png"),
        "parse_rate": plot_before_after(files, out / "parse_rate.png", "nonempty_parse_rate"),
        "pass_at_1": plot_before_after(files, out / "pass_at_1.png", "pass_at_1"),
        "loss": plot_loss(files, out / "loss.png"),
        "throughput": plot_throughput(files, out / "throughput.png"),
    }
    return {k: v for k, v in made.items() if v is not None}


def _e(v) -> str:
    return html.escape(str(v))


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{_e(path.stem)}" src="data:image/png;base64,{data}">'


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset(), cls: str = "") -> str:
    """An HTML table; cells are already escaped HTML."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table{f' class={cls}' if cls else ''}><tr>{th}</tr>{body}</table>"


def _metrics_table(bench: BenchmarkResults) -> str:
    rows = score_rows(bench)
    if not rows:
        return "<p>No benchmark results yet: run <code>mens eval-local</code>.</p>"
    k = bench.k
    head = ["model, decoding", "tasks (n)", "non-empty parse rate", "task pass@1",
            *([f"pass@{k}"] if k > 1 else []), "construct coverage"]
    body = []
    for r in rows:
        c = r.n if r.counts_tasks else None
        m = r.metrics
        body.append([_e(r.name), _e(num(r.n)), _e(rate(m.get("nonempty_parse_rate"), c)),
                     _e(rate(m.get("pass_at_1"), c)), *([_e(rate(m.get("pass_at_k")))] if k > 1 else []),
                     _e(rate(m.get("coverage")))])
    intro = (f"<p>Bench <code>{_e(Path(str(bench.bench or '?')).name)}</code> (split {_e(bench.split or '?')}"
             f"), {_e(k)} answer(s) per task. A task passes when its answer parses and declares what was asked. "
             "Rates show the count of tasks behind them.</p>")
    return intro + _table(head, body, numeric={1, 2, 3, 4, 5})


def _samples(bench: BenchmarkResults) -> str:
    """Sample held-out answers of the tuned model (greedy): some that passed and some that failed, with why."""
    samples = sample_answers(bench, passed=3, failed=5)
    if not samples:
        return ""
    rows = []
    for s in samples:
        verdict = ('<span class="pass">passed</span>' if s.passed else
                   f'<span class="fail">failed</span><br>{_e(s.reason)}')
        rows.append([f"{_e(s.task)}<br><small>{_e(s.category)}</small>", _e(s.prompt),
                     f"<pre>{_e(s.answer.strip())}</pre>", verdict])
    n_fail = sum(not s.passed for s in samples)
    return ("<h2>Sample held-out answers</h2><p>" + _e(f"{len(samples) - n_fail} that passed and {n_fail} that "
            "failed, as the tuned model wrote them (greedy); the reason is the checker's first finding.") + "</p>"
            + _table(["task", "request", "answer", "result"], rows, cls="samples"))


def _failures(bench: BenchmarkResults) -> str:
    """The failure counts by reason, then every failing task with its reason."""
    counts = bench.metrics.get("failures_by_category") or {}
    if not counts:
        return ""
    by_reason = ", ".join(f"{_e(k)} {_e(v)}" for k, v in counts.items())
    rows = [[_e(f.get("category", "?")), _e(f.get("id")), _e(f.get("failure")), _e(str(f.get("reason"))[:200])]
            for f in sorted(bench.failures, key=lambda f: (str(f.get("category")), str(f.get("id"))))]
    table = _table(["category", "task", "failure", "reason"], rows) if rows else ""
    return f"<h2>All failing tasks (greedy)</h2><p>By first reason: {by_reason}.</p>{table}"


def _gates(run: Path) -> str:
    receipt = GateReceipt.read_optional(run / GATE_RECEIPT)
    if receipt is None:
        return "<h2>Gates</h2><p>No gate was run for this model.</p>"
    verdict = '<span class="pass">passed</span>' if receipt.overall_passed else '<span class="fail">not met</span>'
    rows = [[_e(g.gate or g.name), _e(num(g.threshold)), _e(num(g.value)),
             '<span class="pass">yes</span>' if g.passed else '<span class="fail">no</span>']
            for g in receipt.gates]
    return f"<h2>Gates</h2><p>Overall: {verdict}.</p>" + _table(["gate", "threshold", "value", "passed"], rows, {1, 2})


def _parity(run: Path) -> str:
    parity = MergeParity.read_optional(run / MERGE_PARITY)
    if parity is None:
        return ""
    m, s = parity.merged_vs_adapter, served_vs_merged(parity)
    return ("<h2>After the merge</h2><p>" + _e(
        f"Merged model vs adapter: same task result on {m.get('same_result')} of {m.get('tasks')} held-out tasks "
        f"({m.get('same_text')} answers identical, greedy).") + " <code>mens serve</code> " + _e(
        f"on the merged model vs the merged model: same result on {s.get('same_result')} of {s.get('tasks')} "
        f"({s.get('same_text')} identical).") + "</p>")


def write_report(run_dir: str | Path) -> Path:
    """Draw the plots and write report.html; returns its path."""
    files = read_run(run_dir)
    plots = write_plots(files)
    m = files.manifest
    finished = m.finished_at or m.started_at or ""
    base = base_model_info(m).hub_id or (f"{Path(m.base_model).name} (a local directory)" if m.base_model else "?")
    sub = " · ".join(_e(x) for x in (f"base {base}", f"{m.backend or '?'} training",
                                     finished[:16].replace("T", " ")) if x)
    body = [f"<h1>mens run report: {_e(files.run.name)}</h1>", f'<p class="sub">{sub}</p>']
    if m.system_prompt:
        body.append(f"<p>System prompt (training and evaluation): <q>{_e(m.system_prompt)}</q></p>")
    body += ["<h2>Held-out benchmark</h2>", _metrics_table(files.bench)]
    if "modes" in plots:
        body.append(_img(plots["modes"]))
    body += [_samples(files.bench), _failures(files.bench), _gates(files.run), _parity(files.run)]
    per_cat = [p for k, p in plots.items() if k in ("parse_rate", "pass_at_1")]
    if per_cat:
        body += ["<h2>By bench category</h2>", '<div class="grid">' + "".join(_img(p) for p in per_cat) + "</div>"]
    body.append("<h2>Training</h2>")
    body.append(_table(["measured", "value"], [[_e(k), _e(v)] for k, v in training_numbers(files)], numeric={1}))
    curves = [p for k, p in plots.items() if k in ("loss", "throughput")]
    if curves:
        body.append('<div class="grid">' + "".join(_img(p) for p in curves) + "</div>")
    hp = hyperparameters(m)
    if hp:
        body += ["<h2>Hyperparameters (as resolved for this run)</h2>",
                 _table(["setting", "value"], [[_e(k), _e(v)] for k, v in hp])]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>mens report: " + _e(files.run.name)
            + f"</title><style>{_CSS}</style></head><body>" + "\n".join(b for b in body if b) + "</body></html>\n")
    out = files.run / REPORT
    out.write_text(page, encoding="utf-8")
    return out
