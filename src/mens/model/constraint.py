"""The decoding constraint of a language: which decoded texts may still grow into code that parses.

Lives below both `evaluate/` and `serve/` (which decode with it) so neither reaches into the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mens.model.generate import Constraint

if TYPE_CHECKING:  # only the Language protocol's shape is used: model/ does not depend on lang/
    from mens.lang import Language


def language_constraint(lang: Language) -> Constraint:
    """Decode only text that stays a (clean, where the language says so) viable prefix of `lang`; stop only
    when it is finished code; close an answer the token budget cut off."""
    return Constraint(viable=getattr(lang, "clean_viable_prefix", lang.viable_prefix),
                      complete=lambda text: lang.parse(text).has_code, finish=getattr(lang, "finish_text", None))
