"""PNG plots of a run: loss and validation loss, tokens/s, parse rate and pass@1 before/after per category.

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
    ax.plot(*zip(*pts, strict=True), color="#2ca02c", label="tokens/s")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("tokens / s")
    ax.set_title("Training throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_before_after(files: RunFiles, out: Path, metric: str = "nonempty_parse_rate") -> Path | None:
    """Grouped bars per category: base model vs tuned model."""
    tuned = files.bench.get("metrics", {}).get("per_category", {})
    base = files.bench.get("base", {}).get("metrics", {}).get("per_category", {})
    cats = sorted(set(tuned) | set(base))
    if not cats:
        return None
    plt = _plt()
    width = 0.4
    xs = range(len(cats))
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(cats) + 2), 4))
    ax.bar([x - width / 2 for x in xs], [base.get(c, {}).get(metric, 0.0) for c in cats], width,
           label="base", color="#999999")
    ax.bar([x + width / 2 for x in xs], [tuned.get(c, {}).get(metric, 0.0) for c in cats], width,
           label="tuned", color="#1f77b4")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(cats, rotation=45, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"{metric.replace('_', ' ')} by category, before and after")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
