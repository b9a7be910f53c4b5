#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run `andrea main` (default data, default config).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/andrea main "$@"
