"""`telemetry.jsonl`: one flat JSON object a line, `{"ts_ms", "event", ...fields}` (fields at the top level,
which is what `mens status` and mens.report read). Events: train_start, step, eval, checkpoint, train_complete.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mens.run_records import TELEMETRY


class Telemetry:
    """Append-only event log; a no-op on ranks other than 0."""

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.path = Path(run_dir) / TELEMETRY
        self.enabled = enabled

    def emit(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        line = json.dumps({"ts_ms": int(time.time() * 1000), "event": event, **fields}, default=str)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def read_events(run_dir: str | Path) -> list[dict]:
    """Every parseable event (a line cut by a crash is skipped)."""
    path = Path(run_dir) / TELEMETRY
    events = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def run_status(run_dir: str | Path) -> dict:
    """Progress of a run from its telemetry: state, step/total, loss, lr, tokens/s, ETA, last val loss."""
    events = read_events(run_dir)
    if not events:
        return {"state": "not started", "run": str(run_dir)}
    out: dict = {"run": str(run_dir), "state": "running"}
    for ev in events:
        kind = ev.get("event")
        if kind == "train_start":
            out.update(total_steps=ev.get("planned_steps"), started_ms=ev.get("ts_ms"), state="running")
        elif kind == "step":
            out.update({k: ev.get(k) for k in ("step", "total_steps", "loss", "lr", "tokens_per_s", "eta_s",
                                               "progress", "epoch")})
        elif kind == "eval":
            out["val_loss"] = ev.get("val_loss")
        elif kind == "checkpoint":
            out["last_checkpoint"] = ev.get("path")
        elif kind == "train_complete":
            out.update(state="complete", final_loss=ev.get("final_loss"), wall_time_s=ev.get("wall_time_s"))
        elif kind == "train_failed":
            out.update(state="failed", error=ev.get("error"))
    out["updated_s_ago"] = round(time.time() - events[-1].get("ts_ms", 0) / 1000, 1)
    return out
