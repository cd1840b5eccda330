"""`mens corpus extract`: source files and markdown docs -> units (whole files, declarations, regions, blocks).

Every unit records its source path, line span and sha256. Re-running onto an existing output adds only units
whose content hash is not already there: the file is re-created atomically with its old rows and the new ones,
so a failed run leaves it as it was. Files that are not read (too large, binary, not UTF-8, symlinks out of the
input, loops) and units too large for a record go to `<stem>.rejects.jsonl` with a reason.
Run: `mens corpus extract examples docs -o units.jsonl`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mens.corpus.atomic import atomic_writer
from mens.corpus.decl_split import split_decls
from mens.corpus.frontend import line_comment, parse_for_path, resolve_language
from mens.corpus.golden_header import parse_header
from mens.corpus.jsonl import jsonl_line, read_objects, reject_row, write_jsonl
from mens.corpus.limits import MAX_LINE_BYTES
from mens.corpus.markdown import iter_blocks, page_eligible, parse_frontmatter
from mens.corpus.progress import track
from mens.corpus.records import BadLine
from mens.corpus.source_files import SkippedFile, read_source
from mens.corpus.source_files import collect_files as _collect
from mens.corpus.units import CorpusUnit, sha256_text
from mens.lang import Language

MIN_DECL_LINES = 3
"""Declarations shorter than this are not worth a pair of their own (they stay in their file's pair)."""


@dataclass
class ExtractReport:
    """What extract saw and wrote: files by type, units by kind, and files it could not read (with why)."""

    files: Counter = field(default_factory=Counter)
    units_found: Counter = field(default_factory=Counter)
    units_new: int = 0
    units_already_present: int = 0
    units_too_large: int = 0
    units_kept: int = 0
    """Rows of the previous output carried over."""
    unreadable: list[str] = field(default_factory=list)
    split_failed: list[str] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    rejects_path: str = ""

    def reject(self, reason: str, where: str, **extra) -> None:
        self.rejects.append(reject_row(reason, where, **extra))

    @property
    def reconciled(self) -> bool:
        """units found = new + already present + too large."""
        found = sum(self.units_found.values())
        return found == self.units_new + self.units_already_present + self.units_too_large

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.units_found.items()))
        n_files = sum(self.files.values())
        lines = [f"files: {n_files + len(self.unreadable)} = read {n_files} {dict(self.files)} + refused "
                 f"{len(self.unreadable)}; units found {sum(self.units_found.values())} ({kinds})",
                 f"units found = written {self.units_new} new + {self.units_already_present} already present "
                 f"(same sha256) + {self.units_too_large} too large; kept {self.units_kept} previous rows"]
        lines += [f"refused: {u}" for u in self.unreadable]
        lines += [f"not split into declarations (kept as whole file): {s}" for s in self.split_failed]
        if self.rejects_path:
            lines.append(f"rejected {len(self.rejects)} -> {self.rejects_path}")
        return "\n".join(lines)


def embedded_root(language: str = "vox") -> Path:
    """The package's own example corpus for `language` (src/mens/corpus/data/<language>)."""
    return Path(__file__).parent / "data" / language


def collect_files(paths: list[Path], lang: Language,
                  skipped: list[SkippedFile] | None = None) -> list[tuple[Path, str]]:
    """(file, source label) for every source or markdown file under `paths`, sorted; UsageError if missing."""
    return _collect(paths, (*lang.file_extensions, ".md"), skipped)


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
    """sha256 values already in an output file (its bad lines are ignored here; extract moves them to rejects)."""
    seen: set[str] = set()
    if out.is_file():
        for _, obj in read_objects(out):
            if isinstance(obj, dict) and isinstance(obj.get("sha256"), str):
                seen.add(obj["sha256"])
    return seen


def extract_units(paths: list[Path], lang: Language, report: ExtractReport) -> Iterator[CorpusUnit]:
    """Every unit under `paths`, in file order; files that cannot be read are rejects in `report`, never fatal."""
    skipped: list[SkippedFile] = []
    files = collect_files(paths, lang, skipped)
    for s in skipped:
        report.unreadable.append(f"{s.source}: {s.reason}")
        report.reject(s.reason, s.source)
    with track("extract", total=len(files)) as advance:
        for path, source in files:
            advance(1)
            text, reason = read_source(path)
            if text is None:
                report.unreadable.append(f"{source}: {reason}")
                report.reject(reason, source)
                continue
            is_md = path.name.endswith(".md")
            report.files["markdown" if is_md else "source"] += 1
            gen = units_from_markdown if is_md else units_from_source
            for unit in gen(lang, text, source, report):
                report.units_found[unit.kind] += 1
                yield unit


def _previous_rows(out: Path, report: ExtractReport) -> Iterator[bytes]:
    """The previous output's good rows as lines; its bad lines (a torn last line, hand edits) become rejects."""
    if not out.is_file():
        return
    for no, obj in read_objects(out):
        if isinstance(obj, BadLine):
            report.reject(obj.reason, f"{out}:{no}", raw=obj.raw, found_in="previous output")
            continue
        report.units_kept += 1
        yield jsonl_line(obj)


def extract_to_file(paths: list[Path], out: Path, language: str | None = None,
                    rejects: Path | None = None) -> ExtractReport:
    """Extract `paths` (or the embedded corpus when empty) and re-create `out` atomically with its previous rows
    and the units not yet in it; rejects go to `rejects` (default `<out stem>.rejects.jsonl`)."""
    lang = resolve_language(language)
    report = ExtractReport()
    if not paths:
        paths = [embedded_root(lang.name)]
    seen = existing_hashes(out)
    with atomic_writer(out, binary=True) as f:
        for line in _previous_rows(out, report):
            f.write(line)
        for unit in extract_units(paths, lang, report):
            if unit.sha256 in seen:
                report.units_already_present += 1
                continue
            row = unit.model_dump(mode="json", exclude_none=True)
            line = jsonl_line(row)
            if len(line) > MAX_LINE_BYTES:
                report.units_too_large += 1
                report.reject(f"record_too_large: the {unit.kind} unit is {len(line)} bytes as JSON > "
                              f"{MAX_LINE_BYTES} allowed (the trainer's limit)", unit.where, sha256=unit.sha256)
                continue
            seen.add(unit.sha256)
            report.units_new += 1
            f.write(line)
    rejects = rejects or out.with_name(out.stem + ".rejects.jsonl")
    if report.rejects or rejects.exists():
        write_jsonl(rejects, report.rejects)
        report.rejects_path = str(rejects)
    return report
