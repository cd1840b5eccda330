"""`--background`: write RUN/config.yaml, then run `mens train RUN/config.yaml` detached (new session), output to a
log file. The child reads every setting from that file, so nothing is lost between the two processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mens.train.config import TrainConfig


def relaunch(cfg: TrainConfig, log_dir: Path | None, extra_args: list[str]) -> tuple[int, Path]:
    """Check the run directory (free, or --resume settings that match), write its config.yaml and start
    `mens train RUN/config.yaml EXTRA_ARGS` detached; return (pid, log path). Default log dir: RUN/logs."""
    from mens.train.run_config import prepare_run_dir

    path = prepare_run_dir(cfg)
    return spawn_background(["train", str(path), *extra_args], log_dir or Path(cfg.output_dir) / "logs")


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
