"""Progress for long corpus work: a rich bar on stderr when stderr is a terminal, silence otherwise.

Run: `with track("validate", total=n) as advance: … advance()`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def track(label: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n=1)`; draws a transient progress bar only on an interactive stderr."""
    if not sys.stderr.isatty():
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n=1: bar.advance(task, n)
