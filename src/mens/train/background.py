"""`--background`: re-run the same training command detached (new session), output to a log file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def spawn_background(argv: list[str], log_dir: Path) -> tuple[int, Path]:
    """Start `python -m mens <argv>` detached; return (pid, log path). stdin is closed, stdout+stderr -> log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"train_{time.strftime('%Y%m%dT%H%M%S')}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen([sys.executable, "-m", "mens", *argv], stdin=devnull, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    (log_dir / "train.pid").write_text(str(proc.pid))
    return proc.pid, log
