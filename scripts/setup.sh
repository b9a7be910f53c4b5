#!/usr/bin/env bash
# Make (or reuse) the virtual environment .venv and install andrea into it.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh dev      with the test extras
# torch is pinned to 2.13.0 when none is present: that pin is the CPU build on the machines we test
# on, where an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q torch==2.13.0 2> >(grep -v "^WARNING: Location" >&2)
fi
extra=""
if [ "${1:-}" = "dev" ]; then extra="[dev]"; fi
# (pip's notes about the machine's extra package folders are noise; its exit status is kept)
.venv/bin/pip install -q -e ".${extra}" 2> >(grep -v "^WARNING: Location" >&2)
.venv/bin/python -c "import andrea"
