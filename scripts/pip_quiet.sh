#!/usr/bin/env bash
# pip install without the noise, failing as pip fails: the index's "Location ... is ignored: it
# is neither a file nor a directory" lines are dropped, everything else (pip's errors included)
# is shown, and pip's exit status is this script's.
#   bash scripts/pip_quiet.sh PYTHON PIP_INSTALL_ARGS...
set -euo pipefail
py=${1:?usage: pip_quiet.sh PYTHON PIP_INSTALL_ARGS...}
shift
"$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
