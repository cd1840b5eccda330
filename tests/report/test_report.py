"""Report and card from a synthetic run directory: the pictures are real, non-empty and show the series."""

from __future__ import annotations

import json

import pytest
import yaml

from mens.report.card import build_card, write_card
from mens.report.html import write_report
from mens.report.runfiles import read_run


@pytest.fixture
def run_dir(tmp_path):
    tel = [{"event": "train_start"}]
    tel += [{"event": "step", "step": i, "loss": 3.0 / i, "lr": 1e-4, "tokens_per_s": 100 + i} for i in range(1, 21)]
    tel += [{"event": "eval", "step": i, "val_loss": 3.2 / i} for i in (5, 10, 20)]
    lines = [json.dumps(e) for e in tel] + ['{"event": "step", "step": 21, "lo']  # a line cut by a crash
    (tmp_path / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "training_manifest.json").write_text(json.dumps(
        {"base_model": "smollm2-135m", "backend": "qlora", "config": {"lr": 2e-4, "rank": 16}}))
    (tmp_path / "run_summary.json").write_text(json.dumps({"steps": 20, "final_loss": 0.15, "tokens_per_s": 110.0}))
    cats = {"fn": {"nonempty_parse_rate": 0.9, "pass_at_1": 0.8},
            "test": {"nonempty_parse_rate": 1.0, "pass_at_1": 0.5}}
    base_cats = {"fn": {"nonempty_parse_rate": 0.0, "pass_at_1": 0.0},
                 "test": {"nonempty_parse_rate": 0.1, "pass_at_1": 0.0}}
    bench = {"bench": "vox_default", "k": 1,
             "metrics": {"tasks": 2, "nonempty_parse_rate": 0.95, "pass_at_1": 0.65, "pass_at_k": 0.65,
                         "coverage": 1.0, "per_category": cats, "failures_by_category": {"kind": 1}},
             "base": {"metrics": {"nonempty_parse_rate": 0.05, "pass_at_1": 0.0, "per_category": base_cats}}}
    (tmp_path / "benchmark_results.json").write_text(json.dumps(bench))
    return tmp_path


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _colored_pixels(path, rgb: tuple[int, int, int], tol: int = 40) -> int:
    import matplotlib.image as mpimg

    img = (mpimg.imread(path)[..., :3] * 255).astype(int)
    return int((abs(img - rgb).sum(axis=-1) < tol).sum())


def test_report_draws_the_expected_series(run_dir):
    files = read_run(run_dir)
    assert len(files.steps) == 20 and len(files.evals) == 3  # the torn last line is skipped
    html = write_report(run_dir)
    assert html.is_file() and html.read_text().count("data:image/png;base64,") == 5
    for name in ("loss", "throughput", "parse_rate", "pass_at_1", "modes"):
        w, h = _png_size(run_dir / "plots" / f"{name}.png")
        assert w > 300 and h > 200
    loss = run_dir / "plots" / "loss.png"
    assert _colored_pixels(loss, (31, 119, 180)) > 200   # train loss line (blue)
    assert _colored_pixels(loss, (214, 39, 40)) > 50     # validation loss (red)
    bars = run_dir / "plots" / "parse_rate.png"
    assert _colored_pixels(bars, (31, 119, 180)) > 1000  # tuned bars
    assert _colored_pixels(bars, (153, 153, 153)) > 20   # the base model's (small) bar


def test_card_has_metadata_and_honest_numbers(run_dir):
    text = build_card(run_dir)
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded name, as its Hub id
    assert "qlora" in meta["tags"] and meta["library_name"] == "peft"
    values = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert values == {"nonempty_parse_rate": 0.95, "pass@1": 0.65}
    assert "| base model (greedy) | - | 0.05 | 0.00 |" in text and "| tuned (greedy) | 2 | 0.95 | 0.65 |" in text
    assert "No gate was run" in text and "## Limits" in text
    assert write_card(run_dir).name == "README.md"


def test_report_on_an_untrained_dir_says_what_is_missing(tmp_path):
    html = write_report(tmp_path)
    assert "No benchmark results yet" in html.read_text()
    assert "Not evaluated yet" in build_card(tmp_path)


def test_card_gives_the_headline_rates_an_interval(run_dir):
    bench = json.loads((run_dir / "benchmark_results.json").read_text())
    bench["metrics"].update(tasks=60, samples=60, nonempty_parse_rate=0.9167, pass_at_1=0.8333)
    (run_dir / "benchmark_results.json").write_text(json.dumps(bench))
    text = build_card(run_dir)
    assert "non-empty parse 55 of 60, 0.82-0.96; task pass@1 50 of 60, 0.72-0.91" in text
    bench["metrics"]["samples"] = 120  # k = 2: pass@1 is a mean over samples, not a count of tasks
    (run_dir / "benchmark_results.json").write_text(json.dumps(bench))
    assert "95% intervals" not in build_card(run_dir)



def test_report_has_rounded_numbers_resolved_hyperparameters_and_sample_answers(finished_run):
    import re

    run, base_dir = finished_run
    page = write_report(run).read_text()
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    for raw in ("0.4234", "4.1234", "0.9876", "51.123", "384.06", "3893.0", "0.12345"):  # the run's unrounded values
        assert raw not in text, raw
    assert "0.423" in text and "384 s" in text and "3,893 MB" in text
    assert "<td>learning rate</td><td>0.0008</td>" in text
    assert "<td>warmup steps</td><td>1 (configured 30; at most a tenth of the steps)</td>" in text
    assert "<td>global batch (sequences)</td><td>4</td>" in text
    assert str(base_dir) not in text and "output dir" not in text  # local paths are not hyperparameters
    assert "0.75 (3/4)" in text and "0.00 (0/4)" in text  # rates with the count of tasks behind them
    samples = text.split("Sample held-out answers")[1].split("</table>")[0]
    assert samples.count('class="pass">passed') == 2 and samples.count('class="fail">failed') == 2
    assert "missing required text &#x27;while&#x27;" in samples and "fn gcd(a: int, b: int)" in samples


def test_every_bar_carries_its_value_and_n_and_a_zero_is_drawn():
    from mens.report.plots import ZERO_STUB, _labelled_bars, _plt

    plt = _plt()
    fig, ax = plt.subplots()
    _labelled_bars(ax, [0, 1, 2], [0.0, 0.625, None], [8, 8, None], 0.4, "#1f77b4", "tuned")
    labels = [t.get_text() for t in ax.texts]
    bars = ax.patches
    plt.close(fig)
    assert labels == ["0.00\n0/8", "0.62\n5/8", "not\nmeasured"]
    assert bars[0].get_height() == ZERO_STUB and bars[0].get_hatch() and bars[0].get_linewidth() > 0
    assert bars[1].get_height() == 0.625
