"""Size and shape limits of everything the corpus tools and the trainer read, so no input can exhaust memory,
recurse without bound or run for minutes. Every reject that one of these causes names the limit.
"""

MAX_LINE_BYTES = 1_000_000
"""One JSONL record (one line): the trainer's limit; a longer line is rejected with its size."""

MAX_JSON_DEPTH = 64
"""Nesting of arrays/objects in one record; real records nest 3-4 deep."""

MAX_JSONL_FILE_BYTES = 1 << 30
"""One JSONL input file (1 GiB); a larger one is refused before it is read (split it)."""

MAX_RAW_KEEP_BYTES = 16 << 20
"""How much of an over-long line a rejects row keeps (its head); the rest is named by size and sha256."""

MAX_SOURCE_FILE_BYTES = 1 << 20
"""One source or markdown file given to extract (1 MiB; the largest shared doc is about 120 KB)."""

MAX_YAML_BYTES = 1 << 20
"""A config file (mix.yaml, gates) or a markdown frontmatter block."""
