"""`mens report RUN`: plots under RUN/plots/ and a one-page RUN/report.html that embeds them."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from mens.report.plots import plot_before_after, plot_loss, plot_throughput
from mens.report.runfiles import RunFiles, read_run


def write_plots(files: RunFiles) -> dict[str, Path]:
    out = files.run / "plots"
    out.mkdir(exist_ok=True)
    made = {
        "loss": plot_loss(files, out / "loss.png"),
        "throughput": plot_throughput(files, out / "throughput.png"),
        "parse_rate": plot_before_after(files, out / "parse_rate.png", "nonempty_parse_rate"),
        "pass_at_1": plot_before_after(files, out / "pass_at_1.png", "pass_at_1"),
    }
    return {k: v for k, v in made.items() if v is not None}


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _metrics_table(bench: dict) -> str:
    rows = []
    modes = dict(bench.get("modes") or {})
    if not modes and bench.get("metrics"):
        modes = {"tuned": bench["metrics"]}
    if bench.get("base", {}).get("metrics"):
        modes = {"base": bench["base"]["metrics"], **modes}
    for name, m in modes.items():
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{m.get('nonempty_parse_rate', 0):.3f}</td>"
                    f"<td>{m.get('pass_at_1', 0):.3f}</td><td>{m.get('pass_at_k', 0):.3f}</td>"
                    f"<td>{m.get('coverage', 0):.3f}</td></tr>")
    if not rows:
        return "<p>No benchmark results yet: run <code>mens eval-local</code>.</p>"
    return ("<table><tr><th>model / decoding</th><th>non-empty parse rate</th><th>pass@1</th><th>pass@k</th>"
            "<th>coverage</th></tr>" + "".join(rows) + "</table>")


def _failures(bench: dict) -> str:
    """The failure counts by reason, then every failing task grouped by bench category, with its reason."""
    counts = bench.get("metrics", {}).get("failures_by_category") or {}
    if not counts:
        return ""
    items = "".join(f"<li>{html.escape(k)}: {v}</li>" for k, v in counts.items())
    by_cat: dict[str, list[dict]] = {}
    for f in bench.get("failures") or []:
        by_cat.setdefault(f.get("category", "?"), []).append(f)
    rows = "".join(
        f"<tr><td>{html.escape(cat)}</td><td>{html.escape(str(f.get('id')))}</td>"
        f"<td>{html.escape(str(f.get('failure')))}</td><td>{html.escape(str(f.get('reason'))[:160])}</td></tr>"
        for cat, fs in sorted(by_cat.items()) for f in fs)
    table = ("<table><tr><th>category</th><th>task</th><th>failure</th><th>reason</th></tr>" + rows + "</table>"
             if rows else "")
    return f"<h2>Remaining failures</h2><p>By reason:</p><ul>{items}</ul>{table}"


def write_report(run_dir: str | Path) -> Path:
    """Draw the plots and write report.html; returns its path."""
    files = read_run(run_dir)
    plots = write_plots(files)
    s = files.summary
    facts = [("base model", files.manifest.get("base_model", "?")), ("backend", files.manifest.get("backend", "?")),
             ("steps", s.get("steps", len(files.steps))), ("final loss", s.get("final_loss", "?")),
             ("tokens/s", s.get("tokens_per_s", "?")), ("wall time (s)", s.get("wall_time_s", "?"))]
    fact_rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    body = [f"<h1>mens run report: {html.escape(files.run.name)}</h1>",
            f"<table>{fact_rows}</table>", "<h2>Benchmark</h2>", _metrics_table(files.bench), _failures(files.bench)]
    body += [f"<h2>{html.escape(name.replace('_', ' '))}</h2>{_img(p)}" for name, p in plots.items()]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>mens report</title><style>"
            "body{font-family:sans-serif;max-width:960px;margin:2em auto}td,th{padding:2px 10px;text-align:left}"
            "img{max-width:100%}</style></head><body>" + "\n".join(body) + "</body></html>\n")
    out = files.run / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
