"""The extract record (`units.jsonl`, schema `vox_mens_unit_v1`): one program, declaration or doc block.

A unit is raw material, not a training row: `mens corpus validate` checks it and `mens corpus pairs` turns
it into prompts and responses. Run: `mens corpus extract PATH -o units.jsonl`.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

UNIT_SCHEMA_VERSION = "vox_mens_unit_v1"
UnitKind = Literal["file", "decl", "anchor", "doc_block"]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CorpusUnit(BaseModel):
    """One piece of source text with where it came from and what its header/doc says about it."""

    model_config = ConfigDict(extra="allow")

    schema_version: str = UNIT_SCHEMA_VERSION
    kind: UnitKind = Field(description="file (whole program), decl (one top-level declaration), anchor "
                                        "(an ANCHOR region), doc_block (a fenced block in a markdown page).")
    language: str = Field(default="vox", description="Language frontend name (mens.lang.get_language).")
    source: str = Field(description="Source path as given to extract (or embedded:<name>).")
    line_start: int = Field(ge=1, description="First line of the unit in its source file (1-based).")
    line_end: int = Field(ge=1, description="Last line of the unit in its source file (inclusive).")
    sha256: str = Field(description="sha256 of `code` (UTF-8); the incremental-extract key.")
    code: str = Field(min_length=1, description="The unit's text exactly as in the source.")
    description: str | None = Field(default=None, description="Task description (@training_prompt, "
                                    "frontmatter description, or the comment above a declaration).")
    title: str | None = Field(default=None, description="Frontmatter title of the file or page.")
    heading: str | None = Field(default=None, description="doc_block: the nearest heading above the block.")
    context: str | None = Field(default=None, description="doc_block: prose between the heading and the block.")
    header_constructs: list[str] = Field(default_factory=list, description="`constructs:` from the header.")
    decls: list[tuple[str, str]] = Field(default_factory=list, description="Parsed (kind, name) at extract.")
    signature: str | None = Field(default=None, description="decl: the declaration's header line.")
    anchor: str | None = Field(default=None, description="anchor: the ANCHOR name.")
    block: int | None = Field(default=None, description="doc_block: 1-based index of the block in its page.")
    skip_markers: list[str] = Field(default_factory=list, description="Doc-test skip sentinels found.")
    training_eligible: bool = Field(default=True, description="False if the header/frontmatter opts out.")
    ineligible_reason: str | None = None
    parse_ok: bool | None = Field(default=None, description="Parse verdict at extract time (rechecked later).")

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line_start}-{self.line_end}"
