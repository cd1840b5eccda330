"""The machine a benchmark ran on: the same fields in every record under bench/results/.

The CPU model and its bf16 support decide CPU training speed and numerics: the same host name has been a Zen 4 with
AVX512-BF16 (bf16 matmuls), an older EPYC without AVX512 (f32) and a Xeon with AVX512-BF16, up to about 2x apart in
tokens/s, and bf16 and f32 runs of one recipe and seed give different answers, so every record names them.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mens.train.run import ONEDNN_ISA_ENV, cpu_has_native_bf16  # noqa: E402  (imports torch: run benches with the venv's python)


def machine() -> dict:
    cpu, flags, family = platform.processor() or platform.machine(), "", ""
    try:
        fields: dict[str, str] = {}  # the first processor's "key : value" lines
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        cpu = fields.get("model name") or cpu
        flags = fields.get("flags", "")
        # "AMD EPYC" names a Zen 4 and a Zen 5 alike (about 1.7x apart in bf16 training here): family and model don't.
        family = f"family {fields['cpu family']} model {fields.get('model', '')}" if "cpu family" in fields else ""
    except OSError:
        pass
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpu": cpu, "cpu_family_model": family,
            "cpu_count": os.cpu_count(),
            "avx512": "avx512f" in flags.split(), "native_bf16": cpu_has_native_bf16(),
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            **isa_caps()}


COMMIT_FILE = REPO / ".commit"
"""Where a run without git finds its commit: a device call gets a copy of the working tree without `.git`, so the
caller writes `git rev-parse --short HEAD > .commit` first and carries it (bench/gpu_call.sh)."""


def commit() -> str | None:
    """The commit the benchmark ran (short hash, "+dirty" with uncommitted changes to tracked files), from git, else
    from COMMIT_FILE; None when neither says."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        text = COMMIT_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return f"{text} (from {COMMIT_FILE.name})" if text else None


def isa_caps() -> dict:
    """Instruction-set caps set for this run (a bf16 CPU made to take the AVX2 f32 path; docs/dogfood.md), if any:
    such a record measures a capped CPU, not the one its flags name."""
    return {name.lower(): os.environ[name] for name in (ONEDNN_ISA_ENV, "ATEN_CPU_CAPABILITY")
            if os.environ.get(name)}


def gpu() -> dict | None:
    """The first CUDA device as torch sees it (None without one); call it in a process that uses the GPU anyway:
    it creates a CUDA context."""
    import torch

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "count": torch.cuda.device_count(), "memory_mb": p.total_memory // 2**20,
            "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "bf16": torch.cuda.is_bf16_supported()}
