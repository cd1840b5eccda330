"""Hostile inputs for the corpus commands and the trainer's reader, generated in a folder, plus a CLI runner that
reports the exit code, the output and the wall time (with an alarm so that a hang fails instead of blocking).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from mens.cli import main as cli_main

GOOD_CODE = "fn add(a: int, b: int) to int {\n    return a + b\n}\n"
GOOD_PAIR = {"prompt": "Write a Vox function that adds two ints.", "response": GOOD_CODE, "category": "vox_fn",
             "rating": 5}
HANG_LIMIT_S = 2.0
"""Every hostile input must be handled in well under this (the regexes fixed here took minutes)."""

# Each JSONL line is one fault; a line that would be fine must not appear here.
JSONL_FAULTS: dict[str, bytes] = {
    "nested_array": b"[" * 1000 + b"]" * 1000,
    "nested_object": b'{"a":' * 1000 + b"1" + b"}" * 1000,
    "nested_in_pair": json.dumps({**GOOD_PAIR, "meta": json.loads("[" * 100 + "]" * 100)}).encode(),
    "lone_surrogate": b'{"prompt": "\\ud800 hi", "response": "fn f() to int { return 1 }"}',
    "surrogate_key": b'{"\\udfff": 1, "prompt": "p", "response": "fn f() to int { return 1 }"}',
    "nul_raw": b'{"prompt": "a\x00b", "response": "fn f() to int { return 1 }"}',
    "nul_escape": b'{"prompt": "a\\u0000b", "response": "fn f() to int { return 1 }"}',
    "huge_record": b'{"prompt": "' + b"x" * 1_200_000 + b'", "response": "fn f() {}"}',
    "not_utf8": b'{"prompt": "\xff\xfe", "response": "x"}',
    "malformed": b'{"prompt": ',
    "not_object": b"[1, 2, 3]",
    "wrong_types": b'{"prompt": ["a"], "response": {"b": 1}, "messages": "zzz", "lane": ["x"], "code": 5}',
    "fence_bomb": json.dumps({"prompt": "p", "response": "```vox" * 3000}).encode(),
}


def write_jsonl_faults(path: Path, names: list[str], good: int = 1) -> Path:
    """`good` good pairs followed by one line per named fault."""
    lines = [json.dumps({**GOOD_PAIR, "prompt": f"{GOOD_PAIR['prompt']} ({i})"}).encode() for i in range(good)]
    path.write_bytes(b"\n".join(lines + [JSONL_FAULTS[n] for n in names]) + b"\n")
    return path


def _block(name: str) -> str:
    return f"\n```vox\n{GOOD_CODE.replace('add', name)}```\n"


def md_faults() -> dict[str, str]:
    """Markdown pages that once took minutes or crashed: each holds one good vox block (its own) after the fault."""
    return {
        "heading_spaces.md": "# a" + " " * 5000 + "a\n" + _block("h1"),
        "heading_hashes.md": "# " + "# " * 3000 + "x\n" + _block("h2"),
        "prose_brackets.md": "[" * 20000 + "\n" + "[a](" * 5000 + "\n" + _block("p1"),
        "frontmatter_alias_bomb.md": "---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a]\n"
                                     "c: &c [*b, *b, *b, *b, *b, *b, *b]\nstatus: [*c, *c, *c, *c, *c, *c]\n---\n"
                                     + _block("f1"),
        "frontmatter_deep.md": "---\ntitle: " + "[" * 5000 + "]" * 5000 + "\n---\n" + _block("f2"),
        "frontmatter_surrogate.md": '---\ntitle: "\\ud800"\ndescription: "\\udc00"\n---\n' + _block("f3"),
        "unclosed_fences.md": "```vox\n" + "```x " * 5000 + "\n",
    }


def source_faults() -> dict[str, str]:
    """Vox sources that once took minutes: quadratic header regexes and the declaration splitter."""
    return {
        "header_key.vox": "// ---\n// title: a" + " " * 20000 + "b\n// ---\n" + GOOD_CODE.replace("add", "k1"),
        "header_prompt.vox": "// @training_prompt:" + " " * 20000 + "\n" + GOOD_CODE.replace("add", "k2"),
        "split_string.vox": 'fn f() to str {\n    return "a\n}\n' + "x\n" * 4000 + '"\n}\n',
        "deep_braces.vox": "fn f() " + "{" * 5000 + "}" * 5000 + "\n",
    }


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise TimeoutError in the test if the block runs longer than `seconds` (so a hang fails, not blocks)."""
    def _alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(capsys, *args: str | Path) -> tuple[int, str, float]:
    """(exit code, stdout+stderr, seconds) of `mens ARGS` through the real entry point (error mapping included).

    Any exception that escapes `main` is a traceback a user would see: it propagates and fails the test.
    """
    capsys.readouterr()
    start = time.perf_counter()
    code = 0
    with deadline(10 * HANG_LIMIT_S):
        try:
            cli_main.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    took = time.perf_counter() - start
    out = capsys.readouterr()
    return code, out.out + out.err, took


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def leftover_temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk (a hole), for size-cap tests."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path
