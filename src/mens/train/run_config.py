"""RUN/config.yaml: the resolved training config, written before step 0; `mens train RUN/config.yaml` replays the
run, `--background` relaunches from it and `--resume` is checked against it. No torch."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from mens.errors import ConfigError
from mens.run_records import CONFIG, MANIFEST
from mens.train.config import FLAT, RESUMABLE, SPECS, TrainConfig, get_path


def taken_problem(cfg: TrainConfig) -> str | None:
    """Why the run directory cannot take a new run (it holds a finished or started one), or None."""
    run = Path(cfg.output_dir)
    if not cfg.resume and (run / MANIFEST).exists():
        return (f"--output-dir {run} already holds a run ({MANIFEST}); pass --resume to continue it or choose a new "
                "directory (to replay it elsewhere: mens train RUN/config.yaml output_dir=NEW)")
    return None


def resume_problem(cfg: TrainConfig) -> str | None:
    """Why `--resume` is refused: the requested settings differ from the run's config.yaml in a key that must not
    change on resume (every key but RESUMABLE); None when they match or the run has no config.yaml."""
    path = Path(cfg.output_dir) / CONFIG
    if not cfg.resume or not path.is_file():
        return None
    try:
        saved = TrainConfig(**(yaml.safe_load(path.read_text(encoding="utf-8")) or {}))
    except (yaml.YAMLError, ConfigError, TypeError) as e:
        return f"--resume: {path} is not a readable training config ({e}); restore it or start a new --output-dir"
    old, new = saved.model_dump(), cfg.model_dump()
    differ = [s for s in SPECS.values() if s.flat not in RESUMABLE and get_path(old, s.path) != get_path(new, s.path)]
    if not differ:
        return None
    shown = "; ".join(f"{s.path}: {_short(get_path(old, s.path))} -> {_short(get_path(new, s.path))}" for s in differ)
    return (f"--resume: the requested settings differ from {path} in {', '.join(s.path for s in differ)} ({shown}); "
            f"resume with the run's own settings (mens train {path} --resume) or start a new --output-dir. Only "
            f"these may change on resume: {', '.join(FLAT[k] for k in RESUMABLE if k not in ('output_dir', 'resume'))}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def write_run_config(cfg: TrainConfig) -> Path:
    """Write RUN/config.yaml (temp file + rename, so a reader never sees half of it); returns its path."""
    run = Path(cfg.output_dir)
    run.mkdir(parents=True, exist_ok=True)
    path = run / CONFIG
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"# The resolved training config of this run; replay it with: mens train {path} "
                   "output_dir=NEW\n" + cfg.to_yaml(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def prepare_run_dir(cfg: TrainConfig) -> Path:
    """The single-process checks before a run (directory free, or resume settings match), then config.yaml."""
    if problem := taken_problem(cfg) or resume_problem(cfg):
        raise ConfigError(problem)
    return write_run_config(cfg)
