"""Console progress: a rich bar on a terminal (step, loss, lr, tokens/s, ETA), plain lines in logs."""

from __future__ import annotations

import sys
import time


class ProgressView:
    def __init__(self, total: int, start: int, *, enabled: bool, every_s: float = 5.0):
        self.enabled = enabled
        self.every_s = every_s
        self.last_print = 0.0
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, step: int, total: int, loss: float, lr: float, tok_s: float, eta_s: float) -> None:
        if not self.enabled:
            return
        info = f"loss {loss:.4f} | lr {lr:.2e} | tok/s {tok_s:,.0f}"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif time.time() - self.last_print >= self.every_s or step == total:
            self.last_print = time.time()
            print(f"step {step}/{total} | {info} | eta {eta_s:,.0f}s", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
