"""PNG plots of a run: loss and validation loss, tokens/s, parse rate and pass@1 before/after per category, and
the scores of each decoding mode. Every bar carries its value and n; a score of 0 is drawn as an outlined stub.

matplotlib with the Agg backend (no display needed). Each function returns the path it wrote, or None
when the run has no data for that plot.
"""

from __future__ import annotations

from pathlib import Path

from mens.report.runfiles import RunFiles


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(files: RunFiles, out: Path) -> Path | None:
    steps = [(e["step"], e["loss"]) for e in files.steps if e.get("loss") is not None]
    evals = [(e["step"], e.get("val_loss", e.get("loss"))) for e in files.evals
             if e.get("val_loss", e.get("loss")) is not None]
    if not steps and not evals:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot(*zip(*steps, strict=True), label="train loss", color="#1f77b4")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="validation loss", color="#d62728")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("Loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_throughput(files: RunFiles, out: Path) -> Path | None:
    pts = [(e["step"], e["tokens_per_s"]) for e in files.steps if e.get("tokens_per_s") is not None]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*zip(*pts, strict=True), color="#2ca02c", label="tokens/s within each optimizer step")
    overall = files.summary.tokens_per_s
    if isinstance(overall, (int, float)):
        ax.axhline(overall, color="#2ca02c", linestyle="--", alpha=0.7,
                   label=f"{overall:.3g} tokens/s over the training time (validation included)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("tokens / s")
    ax.set_title("Training throughput")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


ZERO_STUB = 0.012
"""Height (in rate units) of the outlined stub drawn for a score of 0, so a zero reads as a measured 0, not a gap."""


def _labelled_bars(ax, xs: list[float], values: list[float | None], ns: list[int | None], width: float, color: str,
                   label: str):
    """Bars with the value and its n written on each; a 0 gets an outlined stub, a missing value says so.
    Returns the legend swatch (plain colour, whatever the first bar looks like)."""
    from matplotlib.patches import Patch

    heights = [ZERO_STUB if v == 0 else (v or 0.0) for v in values]
    bars = ax.bar(xs, heights, width, color=color, edgecolor=color, linewidth=1.2)
    for bar, v, n in zip(bars, values, ns, strict=True):
        if v == 0:
            bar.set_facecolor("white")
            bar.set_hatch("///")
        if v is None:
            text = "not\nmeasured"
        else:
            count = f"{round(v * n)}/{n}" if n and abs(v * n - round(v * n)) < 0.01 else f"n={n}" if n else ""
            text = f"{v:.2f}" + (f"\n{count}" if count else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    return Patch(facecolor=color, edgecolor=color, label=label)


def plot_before_after(files: RunFiles, out: Path, metric: str = "nonempty_parse_rate") -> Path | None:
    """Grouped bars per category: base model vs tuned model (greedy), each labelled with its value and n. None with
    fewer than two categories: `plot_modes` already shows the one category's base and greedy scores."""
    tuned = files.bench.metrics.get("per_category") or {}
    base = ((files.bench.base or {}).get("metrics") or {}).get("per_category") or {}
    cats = sorted(set(tuned) | set(base))
    if len(cats) < 2:
        return None
    plt = _plt()
    width = 0.38
    xs = list(range(len(cats)))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cats) + 2.5), 4))
    swatches = []
    for side, data, color, label, shift in ((0, base, "#999999", "base model", -width / 2),
                                            (1, tuned, "#1f77b4", "tuned (greedy)", width / 2)):
        if side == 0 and not base:
            continue
        swatches.append(_labelled_bars(ax, [x + shift for x in xs], [data.get(c, {}).get(metric) for c in cats],
                                       [data.get(c, {}).get("tasks") for c in cats], width, color, label))
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c}\n(n={(tuned.get(c) or base.get(c) or {}).get('tasks', '?')})" for c in cats],
                       rotation=0 if len(cats) <= 6 else 45, ha="center" if len(cats) <= 6 else "right")
    label = _METRIC_LABELS.get(metric, metric.replace("_", " "))
    return _save_rates(plt, fig, ax, out, label, f"{label} by bench category, before and after training", swatches)


_METRIC_LABELS = {"nonempty_parse_rate": "non-empty parse rate", "pass_at_1": "task pass@1"}


def plot_modes(files: RunFiles, out: Path) -> Path | None:
    """Parse rate and pass@1 of the base model and of each decoding mode of the tuned model, labelled with n."""
    from mens.report.facts import score_rows

    rows = score_rows(files.bench)
    if not rows:
        return None
    plt = _plt()
    width = 0.38
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows) + 2.5), 4))
    swatches = []
    for (metric, color), shift in zip((("nonempty_parse_rate", "#ff7f0e"), ("pass_at_1", "#1f77b4")),
                                      (-width / 2, width / 2), strict=True):
        swatches.append(_labelled_bars(ax, [x + shift for x in xs], [r.metrics.get(metric) for r in rows],
                                       [r.n if r.counts_tasks else None for r in rows], width, color,
                                       _METRIC_LABELS[metric]))
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r.model}\n{r.mode}\n(n={r.n})" for r in rows], fontsize=8)
    return _save_rates(plt, fig, ax, out, "rate over held-out tasks",
                       "Held-out bench: base model and tuned model by decoding mode", swatches)


def _save_rates(plt, fig, ax, out: Path, ylabel: str, title: str, swatches: list) -> Path:
    """The shared frame of a rate chart (0..1 with room for the bar labels, legend, grid), saved as PNG."""
    ax.set_ylim(0, 1.18)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(handles=swatches, loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
