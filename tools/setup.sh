#!/usr/bin/env bash
# Creates (or reuses) .venv with Python >= 3.12 and installs pcgopt into it, editable.
# Usage: bash tools/setup.sh [EXTRAS]     e.g. bash tools/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."

python="$(bash tools/find-python.sh)"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  echo "setup: creating .venv with $("$python" --version 2>&1) ($python)"
  rm -rf .venv
  "$python" -m venv .venv
fi
target="."
[ -n "${1:-}" ] && target=".[$1]"
echo "setup: installing pcgopt${1:+ with extra [$1]} into .venv"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --editable "$target"
echo "setup: done ($(.venv/bin/python --version))"
