"""`mens corpus extract`: source files and markdown docs -> units (whole files, declarations, regions, blocks).

Every unit records its source path, line span and sha256. Re-running onto an existing output appends only
units whose content hash is not already there. Run: `mens corpus extract examples docs -o units.jsonl`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mens.corpus.decl_split import split_decls
from mens.corpus.frontend import line_comment, parse_for_path, resolve_language
from mens.corpus.golden_header import parse_header
from mens.corpus.jsonl import write_jsonl
from mens.corpus.markdown import iter_blocks, page_eligible, parse_frontmatter
from mens.corpus.progress import track
from mens.corpus.units import CorpusUnit, sha256_text
from mens.errors import UsageError
from mens.lang import Language

SKIP_DIRS = {".git", "node_modules", "target", ".venv", "__pycache__", ".vox", "vox-vscode"}
MIN_DECL_LINES = 3
"""Declarations shorter than this are not worth a pair of their own (they stay in their file's pair)."""


@dataclass
class ExtractReport:
    """What extract saw and wrote: files by type, units by kind, and files it could not read (with why)."""

    files: Counter = field(default_factory=Counter)
    units_found: Counter = field(default_factory=Counter)
    units_new: int = 0
    units_already_present: int = 0
    unreadable: list[str] = field(default_factory=list)
    split_failed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.units_found.items()))
        lines = [f"files: {dict(self.files)}; units found {sum(self.units_found.values())} ({kinds})",
                 f"written {self.units_new} new, skipped {self.units_already_present} already present "
                 f"(same sha256)"]
        lines += [f"unreadable: {u}" for u in self.unreadable]
        lines += [f"not split into declarations (kept as whole file): {s}" for s in self.split_failed]
        return "\n".join(lines)


def embedded_root(language: str = "vox") -> Path:
    """The package's own example corpus for `language` (src/mens/corpus/data/<language>)."""
    return Path(__file__).parent / "data" / language


def collect_files(paths: list[Path], lang: Language) -> list[tuple[Path, str]]:
    """(file, source label) for every source or markdown file under `paths`, sorted; UsageError if missing."""
    out: list[tuple[Path, str]] = []
    exts = (*lang.file_extensions, ".md")
    for root in paths:
        if root.is_file():
            out.append((root, str(root)))
        elif root.is_dir():
            for f in sorted(root.rglob("*")):
                rel = f.relative_to(root)
                if f.is_file() and f.name.endswith(exts) and not SKIP_DIRS & set(rel.parts[:-1]):
                    out.append((f, f"{root.name}/{rel.as_posix()}" if root.name else rel.as_posix()))
        else:
            raise UsageError(f"{root}: no such file or folder; pass source files ({', '.join(exts)}) "
                             "or folders that contain them (or no PATH for the embedded corpus)")
    return out


def _unit(lang: Language, **kw) -> CorpusUnit:
    code = kw["code"]
    return CorpusUnit(language=lang.name, sha256=sha256_text(code), **kw)


def _decl_units(lang: Language, text: str, source: str, first_line: int, base: dict,
                report: ExtractReport) -> Iterator[CorpusUnit]:
    slices = split_decls(lang, text, line_comment(lang))
    if slices is None:
        report.split_failed.append(source)
        return
    if len(slices) < 2:
        return  # the whole-file/block unit already is this declaration
    for s in slices:
        if s.end_line - s.start_line + 1 < MIN_DECL_LINES:
            continue
        yield _unit(lang, kind="decl", source=source, line_start=first_line + s.start_line - 1,
                    line_end=first_line + s.end_line - 1, code=s.code, decls=s.decls, signature=s.signature,
                    description=s.comment or None, parse_ok=True, **base)


def units_from_source(lang: Language, text: str, source: str, report: ExtractReport) -> Iterator[CorpusUnit]:
    """Units of one source file: the whole file, each declaration, each ANCHOR region that is not the file."""
    header = parse_header(text)
    n_lines = max(1, len(text.splitlines()))
    res = parse_for_path(lang, text, source)
    base = {"title": header.meta.get("title") if isinstance(header.meta.get("title"), str) else None,
            "header_constructs": header.constructs, "training_eligible": header.training_eligible,
            "ineligible_reason": None if header.training_eligible else "header training_eligible: false "
                                                                      "or status: deprecated"}
    if not text.strip():
        return
    yield _unit(lang, kind="file", source=source, line_start=1, line_end=n_lines, code=text,
                description=header.description, decls=list(res.decls), parse_ok=res.ok, **base)
    if res.ok and not source.endswith(".ui"):
        yield from _decl_units(lang, text, source, 1, base, report)
    lines = text.splitlines()
    for name, (start, end) in sorted(header.anchors.items(), key=lambda kv: kv[1]):
        body = [ln for no, ln in enumerate(lines[start - 1 : end], start=start) if no not in header.header_lines]
        if end < start or not "".join(body).strip():
            continue
        code = "\n".join(body) + "\n"
        r = lang.parse(code)
        yield _unit(lang, kind="anchor", source=source, line_start=start, line_end=end, code=code, anchor=name,
                    description=header.description, decls=list(r.decls), parse_ok=r.ok, **base)


def units_from_markdown(lang: Language, text: str, source: str, report: ExtractReport) -> Iterator[CorpusUnit]:
    """One unit per fenced block of the language, with heading/prose context; declarations of clean blocks."""
    meta, _ = parse_frontmatter(text)
    eligible, why = page_eligible(meta, source)
    title = meta.get("title") if isinstance(meta.get("title"), str) else None
    for b in iter_blocks(text, lang.fence_tags):
        if not b.code.strip():
            continue
        r = lang.parse(b.code)
        base = {"title": title, "training_eligible": eligible, "ineligible_reason": why or None}
        yield _unit(lang, kind="doc_block", source=source, line_start=b.first_line,
                    line_end=max(b.first_line, b.last_line), code=b.code, block=b.index, heading=b.heading,
                    context=b.context or None, skip_markers=b.skip_markers, decls=list(r.decls), parse_ok=r.ok,
                    description=meta.get("description") if isinstance(meta.get("description"), str) else None,
                    **base)
        if r.ok and eligible and not b.skip_markers:
            dbase = {**base, "heading": b.heading, "context": b.context or None, "block": b.index}
            yield from _decl_units(lang, b.code, source, b.first_line, dbase, report)


def existing_hashes(out: Path) -> set[str]:
    """sha256 values already in an output file (bad lines there are ignored, not fatal)."""
    seen: set[str] = set()
    if out.is_file():
        with out.open("rb") as f:
            for raw in f:
                try:
                    seen.add(json.loads(raw)["sha256"])
                except (ValueError, KeyError, TypeError):
                    continue
    return seen


def extract_units(paths: list[Path], lang: Language, report: ExtractReport) -> Iterator[CorpusUnit]:
    """Every unit under `paths`, in file order; unreadable files are recorded in `report`, never fatal."""
    files = collect_files(paths, lang)
    with track("extract", total=len(files)) as advance:
        for path, source in files:
            advance(1)
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                report.unreadable.append(f"{source}: {e} (expected UTF-8 text; fix or remove the file)")
                continue
            is_md = path.name.endswith(".md")
            report.files["markdown" if is_md else "source"] += 1
            gen = units_from_markdown if is_md else units_from_source
            for unit in gen(lang, text, source, report):
                report.units_found[unit.kind] += 1
                yield unit


def extract_to_file(paths: list[Path], out: Path, language: str | None = None) -> ExtractReport:
    """Extract `paths` (or the embedded corpus when empty) and append units not yet in `out`."""
    lang = resolve_language(language)
    report = ExtractReport()
    if not paths:
        paths = [embedded_root(lang.name)]
    seen = existing_hashes(out)

    def new_rows() -> Iterator[dict]:
        for unit in extract_units(paths, lang, report):
            if unit.sha256 in seen:
                report.units_already_present += 1
                continue
            seen.add(unit.sha256)
            report.units_new += 1
            yield unit.model_dump(mode="json", exclude_none=True)

    write_jsonl(out, new_rows(), append=True)
    return report
