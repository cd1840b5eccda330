"""bench/render_report.py: a card's metadata shown as a block, its Markdown tables drawn, its links resolved against
the card's own folder; a dogfood directory names its run and merged model. (Chromium itself is not run here.)"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import render_report  # noqa: E402


def test_card_page_shows_metadata_tables_and_resolves_plots(tmp_path):
    card = tmp_path / "run" / "README.md"
    card.parent.mkdir()
    card.write_text("---\nbase_model: someone/base\nlicense: mit\n---\n\n# vox\n\n| a | b |\n|---|---|\n| 1 | <2> |\n\n"
                    "![loss](plots/loss.png)\n", encoding="utf-8")
    page = render_report.card_page(card, tmp_path / "card.html").read_text(encoding="utf-8")
    assert "<div class='meta'>base_model: someone/base\nlicense: mit</div>" in page
    assert "<table>" in page and "<td>&lt;2&gt;</td>" in page and "<h1>vox</h1>" in page
    assert f"<base href='{card.parent.as_uri()}/'>" in page and 'src="plots/loss.png"' in page


def test_runs_of_a_dogfood_dir_and_of_a_run_dir(tmp_path):
    (tmp_path / "dogfood_summary.json").write_text(json.dumps({"schema": "vox_mens_dogfood_summary_v1", "run": "/x/run",
                                                               "merged": "/x/merged"}))
    run, merged, summary = render_report.runs_of(tmp_path)
    assert (run, merged, summary.run) == (Path("/x/run"), Path("/x/merged"), "/x/run")
    assert render_report.runs_of(tmp_path / "run") == (tmp_path / "run", None, None)
