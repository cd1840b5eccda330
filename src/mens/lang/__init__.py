"""Language frontends behind one protocol (`Language`); `get_language("vox")` returns the Vox frontend.

No torch and nothing else of mens is imported here.
"""

from __future__ import annotations

import importlib

from mens.errors import UsageError
from mens.lang.base import Diagnostic, Language, Mode, ParseResult

# name -> "module:attribute"; imported on first use so a language's cost is paid only when it is used.
_REGISTRY = {
    "vox": "mens.lang.vox:VOX",
    "python": "mens.lang.python:PYTHON",
}

__all__ = ["Diagnostic", "Language", "Mode", "ParseResult", "get_language", "language_names", "language_for_path"]


def language_names() -> list[str]:
    return sorted(_REGISTRY)


def get_language(name: str) -> Language:
    """The frontend registered as `name`; UsageError listing the known names otherwise."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown language {name!r}; known languages: {', '.join(language_names())}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def language_for_path(path: str) -> Language | None:
    """The frontend whose file extensions match `path`, or None."""
    for name in _REGISTRY:
        lang = get_language(name)
        if any(path.endswith(ext) for ext in lang.file_extensions):
            return lang
    return None
