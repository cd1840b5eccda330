"""The decoding constraint of a language: which decoded texts may still grow into code that parses.

Lives below both `evaluate/` and `serve/` (which decode with it) so neither reaches into the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mens.model.generate import Constraint

if TYPE_CHECKING:  # only the Language protocol's shape is used: model/ does not depend on lang/
    from mens.lang import Language


def language_constraint(lang: Language) -> Constraint:
    """Decode only text that stays a (clean, where the language says so) viable prefix of `lang`; stop as
    finished code; close an answer that stopped unfinished or that the token budget cut off.

    Where the language offers an incremental checker (`prefix_checker()`), each constraint gets its own, so
    make one constraint per answer (or per stream of answers decoded one after another)."""
    checker = getattr(lang, "prefix_checker", None)
    viable = checker() if checker is not None else getattr(lang, "clean_viable_prefix", lang.viable_prefix)
    return Constraint(viable=viable, complete=lambda text: lang.parse(text).has_code,
                      finish=getattr(lang, "finish_text", None), closing=getattr(lang, "closing_suffix", None),
                      stream_closing=getattr(lang, "stream_closing_suffix", None))
