"""A finished run's report and model card as a person sees them: each page rendered to PNG in headless Chromium.

Tests check the report's and card's contents as text; this shows whether they read right once drawn (labels on
every bar, tables that fit, images that resolve). The card is Markdown with YAML metadata, as the Hugging Face Hub
shows it: the metadata block first, then the text rendered with tables (markdown-it-py, which rich already brings).

Needs Debian's Chromium (`apt-get install chromium`); nothing here is run by the tests. Run:
`python bench/render_report.py DIR [--out DIR]`, where DIR is a `mens dogfood -o` directory or a run directory; it
writes report.png, card.png and, for a dogfood run, merged-card.png, with render.json naming the machine.
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import REPO, machine

from mens.run_records import DOGFOOD_SUMMARY, MODEL_CARD, REPORT, DogfoodSummary  # noqa: E402 (after machine's path)

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")
WIDTH = 1200
MAX_HEIGHT = 12000
"""The window the page is drawn in; the PNG is then cut to where the page's content ends."""

_CARD_CSS = """
body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
.meta{background:#f6f8fa;border:1px solid #ddd;padding:8px;font-size:12px;white-space:pre-wrap}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 8px}th{background:#f5f5f5}
pre{background:#f6f8fa;padding:8px;overflow:auto}code{font-size:13px}img{max-width:100%}
"""


def runs_of(path: Path) -> tuple[Path, Path | None, DogfoodSummary | None]:
    """(run dir, merged dir or None, the dogfood summary or None) for a dogfood output dir or a run dir."""
    if not (path / DOGFOOD_SUMMARY).is_file():
        return path, None, None
    summary = DogfoodSummary.read(path / DOGFOOD_SUMMARY)
    return Path(summary.run), (Path(summary.merged) if summary.merged else None), summary


def card_page(readme: Path, out: Path) -> Path:
    """The card as an HTML page at `out` whose links resolve against the README's folder, metadata block first."""
    from markdown_it import MarkdownIt

    text = readme.read_text(encoding="utf-8")
    meta, body = "", text
    if text.startswith("---\n"):
        end = text.index("\n---", 4)
        meta, body = text[4:end], text[end + 4:]
    rendered = MarkdownIt("commonmark", {"html": False}).enable("table").render(body)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><base href='{readme.parent.as_uri()}/'>"
            f"<style>{_CARD_CSS}</style></head><body><div class='meta'>{html.escape(meta)}</div>{rendered}"
            "</body></html>\n")
    out.write_text(page, encoding="utf-8")
    return out


def screenshot(page: Path, png: Path) -> Path:
    """`page` drawn by Chromium at WIDTH px, cut below its last non-white row."""
    from PIL import Image, ImageChops

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("render_report: Chromium not found; install Debian's `chromium` package")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        f"--window-size={WIDTH},{MAX_HEIGHT}", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
    img = Image.open(png).convert("RGB")
    box = ImageChops.difference(img, Image.new("RGB", img.size, (255, 255, 255))).getbbox()
    if box is not None:
        img = img.crop((0, 0, img.width, min(img.height, box[3] + 24)))
    img.quantize(colors=128).save(png, optimize=True)  # a report page, not a photo: 128 colours read the same
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="A `mens dogfood -o` directory or a run directory.")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "render")
    args = ap.parse_args()
    run, merged, summary = runs_of(args.dir.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        made = [screenshot(run / REPORT, args.out / "report.png"),
                screenshot(card_page(run / MODEL_CARD, Path(tmp) / "card.html"), args.out / "card.png")]
        if merged is not None and (merged / MODEL_CARD).is_file():
            made.append(screenshot(card_page(merged / MODEL_CARD, Path(tmp) / "merged-card.html"),
                                   args.out / "merged-card.png"))
    record = {"bench": "render_report", **machine(), "source": str(args.dir), "pages": [p.name for p in made],
              "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()}
    if summary is not None:
        record["dogfood_tuned"] = summary.tuned
    (args.out / "render.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for png in made:
        print(png)


if __name__ == "__main__":
    main()
