#!/usr/bin/env bash
# One device call for the GPU benchmarks: install the carried wheels (bench/gpu_wheels.sh, carried as .whl), print
# versions and the GPU, check that bitsandbytes runs a 4-bit linear, then by MODE:
#   smoke (first call): every run of bench/gpu_train_speed.py for 2 steps on tiny shapes (a broken path costs
#          seconds), `mens probe`, and bench/gpu_headline.py (the qwen_4080_16g job on a Qwen3.5-4B shape, capped at
#          a 16 GB card's memory);
#   timed: the timed runs of bench/gpu_train_speed.py (--grouped: one process per shape, imports paid once);
#   all:   both, smoke first.
# Everything lands under $OUT (JSON + log).
# Run (through the device tool): first `git rev-parse --short HEAD > .commit` here (the device's copy of the tree
# has no .git; the records take their commit from it), then command `MODE=smoke bash bench/gpu_call.sh`,
# carry [".whl", ".commit"], timeout_s 600.
# Environment: MODE (default all), BUDGET_S (timed runs' budget, default 400), ARGS (extra flags for the timed runs),
# ARGS2 (when set, a second timed pass with these flags instead, into gpu_train_speed2-<host>.json), HEADLINE_ARGS
# (extra flags for gpu_headline.py), GPU_TESTS (test paths: their `gpu` tests run first, at most 150 s).
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/gpu_call.log"
PY=${PYTHON:-python3}
HOST=$(hostname)
{
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "wheel install failed"; exit 3; }
  fi
  export PYTHONPATH="/tmp/site:$PWD/.whl/bnb:$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
  $PY - <<'EOF' || exit 4
import importlib.metadata as md
import torch
for n in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes", "liger-kernel",
          "triton", "pydantic", "tokenizers", "huggingface-hub"):
    try:
        print(f"{n} {md.version(n)}")
    except md.PackageNotFoundError:
        print(f"{n} MISSING")
print("cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
import bitsandbytes as bnb  # a 4-bit linear forward and backward, before any benchmark time is spent
lin = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
lin(x).float().sum().backward()
print("bitsandbytes 4-bit linear ok:", tuple(x.grad.shape))
EOF
  if [ -n "${GPU_TESTS:-}" ]; then
    echo "== gpu tests: $GPU_TESTS"
    # shellcheck disable=SC2086  # GPU_TESTS is a list of test paths
    timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS || echo "gpu tests: exit $?"
  fi
  MODE=${MODE:-all}
  if [ "$MODE" != timed ]; then
    if [ "${SKIP_SMOKE:-0}" != 1 ]; then
      echo "== smoke: every run, 2 steps, tiny shapes"
      $PY bench/gpu_train_speed.py --device cuda --tiny --smoke --budget-s 150 \
        --out "$OUT/gpu_train_speed-smoke-$HOST.json" || echo "smoke: some runs failed (see above)"
      echo "== mens probe"
      $PY -c "from mens.cli.main import main; main(['probe'])" || echo "probe failed"
    fi
    echo "== headline: qwen_4080_16g on a Qwen3.5-4B shape under a 16 GB cap"
    # shellcheck disable=SC2086  # HEADLINE_ARGS is a list of flags
    $PY bench/gpu_headline.py --device cuda ${HEADLINE_ARGS:-} --out "$OUT/gpu_headline-$HOST.json" \
      || echo "headline: exit $?"
  fi
  if [ "$MODE" != smoke ]; then
    echo "== timed runs"
    # shellcheck disable=SC2086  # ARGS is a list of flags
    $PY bench/gpu_train_speed.py --device cuda --grouped --budget-s "${BUDGET_S:-400}" ${ARGS:-} \
      --out "$OUT/gpu_train_speed-$HOST.json"
    if [ -n "${ARGS2:-}" ]; then
      echo "== timed runs, second pass: $ARGS2"
      # shellcheck disable=SC2086  # ARGS2 is a list of flags
      $PY bench/gpu_train_speed.py --device cuda --grouped --budget-s "${BUDGET_S:-400}" $ARGS2 \
        --out "$OUT/gpu_train_speed2-$HOST.json"
    fi
  fi
} 2>&1 | tee "$LOG"
