"""YAML from user files, bounded: a size cap, no aliases (no "billion laughs"), no unbounded recursion, and
only text that can be written back as UTF-8. Errors are ConfigError naming the file.
Run: used for mix.yaml, gates files and markdown frontmatter.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from mens.corpus.jsonrow import shape_problem
from mens.corpus.limits import MAX_JSON_DEPTH, MAX_YAML_BYTES
from mens.errors import ConfigError

_BRACKET = re.compile(r"[\[\]{}]")


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors/aliases (an alias can make a small file expand exponentially) and nesting
    deeper than MAX_JSON_DEPTH (the composer recurses once per level)."""

    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here",
                                              event.start_mark)
        if self._depth >= MAX_JSON_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nests more than {MAX_JSON_DEPTH} levels (expected a "
                                              "flat config)", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _bracket_depth_exceeds(text: str, limit: int) -> bool:
    """True when `[`/`{` nest deeper than `limit`, counting every bracket (quoted ones too, so it can only
    over-count). PyYAML's scanner is quadratic in flow depth and runs ahead of the composer, so this runs first."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _BRACKET.finditer(text):
        depth = depth + 1 if m.group() in "[{" else max(0, depth - 1)
        if depth > limit:
            return True
    return False


def parse_yaml(text: str, where: str) -> object:
    """`text` as YAML (ConfigError on syntax, size, aliases, depth or text that is not valid Unicode)."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: YAML is {len(text)} characters > {MAX_YAML_BYTES} allowed; "
                          "a config this large is not a config")
    if _bracket_depth_exceeds(text, MAX_JSON_DEPTH):
        raise ConfigError(f"{where}: not valid YAML: brackets nest more than {MAX_JSON_DEPTH} levels (expected a "
                          "flat config)")
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nests too deeply (expected a flat config)") from None
    problem = shape_problem(data, True)
    if problem:
        raise ConfigError(f"{where}: {problem}; fix the file")
    return data


def load_yaml_file(path: Path) -> object:
    """The YAML document in `path` (ConfigError when unreadable, too big or invalid)."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: YAML file is {size} bytes > {MAX_YAML_BYTES} allowed")
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}; check the path") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    return parse_yaml(text, str(path))
