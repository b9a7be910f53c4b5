#!/usr/bin/env bash
# andrea-120m on one GPU: training tokens/s and MFU at batch 8 × 1024 and 32 × 1024 (halved until
# it fits), eager and with torch.compile, and decode tokens/s at batch 1 (KV cache, greedy, 512
# new tokens). Synthetic token ids: no corpus, no network. Prints a markdown section on stdout,
# progress on stderr.
#
#   benchmarks/gpu.sh              on a machine with an NVIDIA GPU and torch with CUDA
#   benchmarks/gpu.sh --dry-run    tiny sizes on the CPU, to check the script end to end
#
# Each part runs under its own `timeout`; the whole stays within GPU_BENCH_SECONDS (default 450,
# so it ends within 8 minutes). Parts that fail, time out or find no time left say so in the table.
# PYTHON picks the interpreter (default: the first of python3, python, .venv/bin/python whose torch
# sees CUDA; with --dry-run, the first that has torch).
set -u
cd "$(dirname "$0")/.."

DRY=""
case "${1:-}" in
  --dry-run) DRY="--dry-run" ;;
  "") ;;
  *) echo "usage: benchmarks/gpu.sh [--dry-run]" >&2; exit 2 ;;
esac
BUDGET=${GPU_BENCH_SECONDS:-450}
START=$SECONDS

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  check='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'
  [ -n "$DRY" ] && check='import torch'
  for candidate in python3 python .venv/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 && timeout 120 "$candidate" -c "$check" >/dev/null 2>&1; then
      PY=$candidate
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  if [ -n "$DRY" ]; then
    echo "gpu.sh: no python with torch found (set PYTHON=...)." >&2
  else
    echo "gpu.sh: no python whose torch sees a CUDA device (set PYTHON=..., or use --dry-run on a CPU)." >&2
  fi
  exit 1
fi
# andrea itself needs only torch here: it is used from the working tree, not installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! err=$("$PY" -c "import andrea.model, andrea.generate, andrea.flops" 2>&1); then
  echo "gpu.sh: andrea does not import with $PY: $(echo "$err" | tail -n 1)" >&2
  exit 1
fi

ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
TRAIN_ROWS=""
DECODE_ROWS=""

# part LIMIT TABLE LABEL SHAPE ARGS...: run one gpu_bench.py part, add its row (or why it has none)
part() {
  local limit=$1 table=$2 label=$3 shape=$4
  shift 4
  local left=$((BUDGET - (SECONDS - START)))
  local row rc
  if [ "$left" -lt 30 ]; then
    row="skipped: the time budget of ${BUDGET} s was spent"
  else
    [ "$limit" -gt "$left" ] && limit=$left
    echo "gpu.sh: $label, $shape (at most ${limit} s)" >&2
    row=$(timeout -k 10 "$limit" "$PY" benchmarks/gpu_bench.py "$@" $DRY 2>"$ERR")
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      row="timed out after ${limit} s"
    elif [ "$rc" -ne 0 ]; then
      row="failed (exit $rc): $(grep -v '^\s*$' "$ERR" | tail -n 1 | tr '|' '/')"
    elif [ -z "$row" ]; then
      row="ended without a result"
    fi
  fi
  if [ "${row:0:1}" != "|" ]; then  # no measurement: say why in the row, leave the figures empty
    if [ "$table" = train ]; then row="| $label | $shape | $row | | | | | |"; else row="| $label | $shape | $row | | |"; fi
  fi
  echo "$row" >&2
  if [ "$table" = train ]; then TRAIN_ROWS+="$row"$'\n'; else DECODE_ROWS+="$row"$'\n'; fi
}

HEADER=$(timeout -k 10 120 "$PY" benchmarks/gpu_bench.py header $DRY 2>"$ERR") || {
  echo "gpu.sh: $(tail -n 1 "$ERR")" >&2
  exit 1
}
TRAIN_COLUMNS=$("$PY" benchmarks/gpu_bench.py columns train) && DECODE_COLUMNS=$("$PY" benchmarks/gpu_bench.py columns decode) || exit 1

# the plain runs and decode first; torch.compile (minutes of compiling) with what time is left
if [ -n "$DRY" ]; then M="andrea-tiny"; SMALL="2 × 64"; LARGE="8 × 64"; else M="andrea-120m"; SMALL="8 × 1024"; LARGE="32 × 1024"; fi
part 120 train "$M, eager" "$SMALL" train --batch 8
part 120 train "$M, eager" "$LARGE" train --batch 32 --fit
part 60 decode "$M" "bf16" decode --dtype bf16
part 60 decode "$M" "fp32" decode --dtype fp32
part 180 train "$M, torch.compile" "$SMALL" train --batch 8 --compile
part 180 train "$M, torch.compile" "$LARGE" train --batch 32 --fit --compile

echo "$HEADER"
echo
echo "$TRAIN_COLUMNS"
printf "%s" "$TRAIN_ROWS"
echo
echo "$DECODE_COLUMNS"
printf "%s" "$DECODE_ROWS"
echo
echo "Whole script: $((SECONDS - START)) s."
