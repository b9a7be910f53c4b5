#!/usr/bin/env bash
# andrea-120m on one GPU beside transformers' GPT-2 of the same shape: training tokens/s and MFU at
# batch 8 × 1024 and 32 × 1024 (halved until it fits), eager and with torch.compile; decode
# tokens/s at batch 1 (greedy, 16 + 512 tokens, bf16) with and without a CUDA graph against
# `generate` on the same weights; then `andrea train` (andrea-12m, 32 × 1024, 40 s) and
# `andrea generate` on the main job's shards, if the cache holds them (set ANDREA_DATA=DIR to
# name a shard folder). Synthetic token ids elsewhere: no network. Prints a markdown section on
# stdout, progress on stderr.
#
#   benchmarks/gpu.sh              on a machine with an NVIDIA GPU and torch with CUDA
#   benchmarks/gpu.sh --dry-run    tiny sizes on the CPU, to check the script end to end
#   benchmarks/gpu.sh --plan       no runs: the section with every row marked unmeasured
#
# Each part runs under its own `timeout`; the whole stays within GPU_BENCH_SECONDS (default 345,
# so it ends within 6 minutes; a dry run, on a CPU that may be shared, gets 4 times the time). Parts that fail, time out or find no time left say so in the table.
# PYTHON picks the interpreter (default: the first of python3, python, .venv/bin/python whose torch
# sees CUDA; with --dry-run, the first that has torch).
set -u
cd "$(dirname "$0")/.."

DRY=""
PLAN=""
case "${1:-}" in
  --dry-run) DRY="--dry-run" ;;
  --plan) PLAN="--plan" ;;
  "") ;;
  *) echo "usage: benchmarks/gpu.sh [--dry-run | --plan]" >&2; exit 2 ;;
esac
SCALE=1
[ -n "$DRY" ] && SCALE=4
BUDGET=${GPU_BENCH_SECONDS:-$((345 * SCALE))}
START=$SECONDS

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  check='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'
  [ -n "$DRY$PLAN" ] && check='import torch'
  for candidate in python3 python .venv/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 && timeout 120 "$candidate" -c "$check" >/dev/null 2>&1; then
      PY=$candidate
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  if [ -n "$DRY$PLAN" ]; then
    echo "gpu.sh: no python with torch found (set PYTHON=...)." >&2
  else
    echo "gpu.sh: no python whose torch sees a CUDA device (set PYTHON=..., or use --dry-run on a CPU)." >&2
  fi
  exit 1
fi
# andrea itself needs only torch here: it is used from the working tree, not installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! err=$("$PY" -c "import andrea.model, andrea.decoding.generate, andrea.decoding.plan, andrea.flops" 2>&1); then
  echo "gpu.sh: andrea does not import with $PY: $(echo "$err" | tail -n 1)" >&2
  exit 1
fi

ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
declare -A ROWS=([train]="" [decode]="" [cli]="")
declare -A EMPTY=([train]=" | | | | | | |" [decode]=" | | | |" [cli]="")

# part LIMIT TABLE LABEL SHAPE ARGS...: run one gpu_bench.py part, add its rows (or why it has none)
part() {
  local limit=$(($1 * SCALE)) table=$2 label=$3 shape=$4
  shift 4
  local left=$((BUDGET - (SECONDS - START)))
  local rows rc
  if [ -n "$PLAN" ]; then
    rows="unmeasured: no CUDA device where this ran"
  elif [ "$left" -lt 30 ]; then
    rows="skipped: the time budget of ${BUDGET} s was spent"
  else
    [ "$limit" -gt "$left" ] && limit=$left
    echo "gpu.sh: $label, $shape (at most ${limit} s)" >&2
    rows=$(timeout -k 10 "$limit" "$PY" benchmarks/gpu_bench.py "$@" $DRY 2>"$ERR")
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      rows="timed out after ${limit} s"
    elif [ "$rc" -ne 0 ]; then
      rows="failed (exit $rc): $(grep -v '^\s*$' "$ERR" | tail -n 1 | tr '|' '/')"
    elif [ -z "$rows" ]; then
      rows="ended without a result"
    fi
  fi
  if [ "${rows:0:1}" != "|" ]; then  # no measurement: say why in the row, leave the figures empty
    rows="| $label | $shape | $rows |${EMPTY[$table]}"
  fi
  echo "$rows" >&2
  ROWS[$table]+="$rows"$'\n'
}

HEADER=$(timeout -k 10 120 "$PY" benchmarks/gpu_bench.py header $DRY $PLAN 2>"$ERR") || {
  echo "gpu.sh: $(tail -n 1 "$ERR")" >&2
  exit 1
}

# the eager runs, decoding and the CLI first; torch.compile (minutes of compiling) with what is left
if [ -n "$DRY" ]; then SMALL="2 × 64"; LARGE="8 × 64"; else SMALL="8 × 1024"; LARGE="32 × 1024"; fi
[ -n "$PLAN" ] && echo "gpu.sh: --plan: nothing runs; every row says it is unmeasured" >&2
part 80 train "andrea, gpt2" "eager, $SMALL" train --batch 8 --steps 10
part 110 train "andrea, andrea-whole-loss, gpt2" "eager, $LARGE" train --batch 32 --fit --models andrea,andrea-whole-loss,gpt2
part 90 decode "andrea, transformers" "bf16" decode --dtype bf16
part 100 cli "andrea train + andrea generate" "main job's shards" cli ${ANDREA_DATA:+--data "$ANDREA_DATA"}
part 240 train "andrea, gpt2" "torch.compile, $LARGE" train --batch 32 --fit --compile --steps 10

echo "$HEADER"
for table in train decode cli; do
  echo
  "$PY" benchmarks/gpu_bench.py columns "$table" || exit 1
  printf "%s" "${ROWS[$table]}"
done
echo
[ -z "$PLAN" ] && echo "Whole script: $((SECONDS - START)) s."
exit 0
