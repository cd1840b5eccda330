"""`--background` writes OUT/config.yaml, relaunches `mens train OUT/config.yaml` detached, logs to
OUT/logs/train_*.log, and `mens status` follows it to completion."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml


def test_background_run_and_status(data_dir, tmp_path, tiny_model_dir):
    out = tmp_path / "bg"
    cmd = [sys.executable, "-m", "mens", "train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model",
           str(tiny_model_dir), "--backend", "lora", "--device", "cpu", "--max-steps", "3", "--seq-len", "96",
           "--rank", "4", "--alpha", "8", "--min-examples", "10", "--threads", "1", "--save-every", "0",
           "--preset", "cpu", "--background"]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr
    assert "training in the background: pid" in done.stdout
    logs = list((out / "logs").glob("train_*.log"))
    assert len(logs) == 1
    pid = int((out / "logs" / "train.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")  # the child is started from the run's config.yaml, not from flags
    with contextlib.suppress(OSError):  # (only where /proc exists and the child still runs)
        assert cmdline.read_bytes().split(b"\0")[3:5] == [b"train", str(out / "config.yaml").encode()]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["data"]["seq_len"], saved["adapter"]["r"], saved["schedule"]["max_steps"]) == (96, 4, 3)
    state = None
    while time.time() - t0 < 120:
        st = subprocess.run([sys.executable, "-m", "mens", "status", str(out), "--json"], capture_output=True,
                            text=True, timeout=60)
        state = json.loads(st.stdout)["state"]
        if state in ("complete", "failed"):
            break
        time.sleep(1)
    assert state == "complete", logs[0].read_text()[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    assert "step 3/3" in logs[0].read_text()
    assert pid > 0
