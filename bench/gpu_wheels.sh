#!/usr/bin/env bash
# Wheels the lent GPU machine lacks for bench/gpu_train_speed.py (cp312, manylinux x86_64), into .whl/ (ignored by
# git), under the device tool's 64 MiB carry limit: bitsandbytes is cut down to its Python files and the one CUDA 13
# library the device's torch (cu130) loads. Run here, where PyPI is reachable; bench/gpu_call.sh installs them there.
# Run: bash bench/gpu_wheels.sh [DIR]   (then pass `carry: [".whl"]` to the device tool)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DIR"
# Versions: the project's pins (constraints.txt) where it has one, else what .venv resolved with `.[bench]`.
PKGS=(
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # the TRL side (pandas, pyarrow, xxhash are there)
  liger-kernel==0.8.5                                              # the third side (triton is there)
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection  # mens' records
  transformers==5.23.0   # the device has 5.17 (its huggingface-hub 1.33 and tokenizers 0.23.2 suit 5.23)
  peft==0.21.2           # the project's pin (the device's own peft may predate transformers 5.23)
)
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$DIR" "${PKGS[@]}"

# bitsandbytes: the full wheel holds a library for every CUDA version (over the limit); keep one.
BNB=$(mktemp -d)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$BNB" bitsandbytes==0.50.2
rm -rf "$DIR/bnb" && mkdir -p "$DIR/bnb"
"$PY" - "$BNB" "$DIR/bnb" <<'EOF'
import re, sys, zipfile
from pathlib import Path

src, out = Path(sys.argv[1]), Path(sys.argv[2])
wheel = next(src.glob("bitsandbytes-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        keep = name.endswith(".py") or ".dist-info/" in name or re.search(r"libbitsandbytes_(cuda130|cpu)\.so$", name)
        if keep:
            z.extract(name, out)
print("bitsandbytes kept:", sorted(p.name for p in out.rglob("*.so")))
EOF
rm -rf "$BNB"
du -sh "$DIR"; ls -la "$DIR" | awk '{print $5, $9}'
total=$(du -sm "$DIR" | cut -f1)
if [ "$total" -ge 60 ]; then echo "error: $DIR is ${total} MiB; the device tool carries 64 MiB in all" >&2; exit 1; fi
