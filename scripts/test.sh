#!/usr/bin/env bash
# The whole test suite: set up (idempotent), then pytest. Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
. .venv/env.sh
exec python -m pytest "$@"
