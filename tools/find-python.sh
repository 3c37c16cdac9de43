#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 interpreter (egglog 14 needs 3.12), or explains how to get
# one and exits 1. Order: $PCGOPT_PYTHON; python3.12 / python3.13 on PATH; pyenv's 3.12 / 3.13
# installs (found even when pyenv's shims do not select them); python3 if it is new enough.
set -u

ok() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

if [ -n "${PCGOPT_PYTHON:-}" ]; then
  if ok "$PCGOPT_PYTHON"; then echo "$PCGOPT_PYTHON"; exit 0; fi
  echo "PCGOPT_PYTHON=$PCGOPT_PYTHON is not a working Python >= 3.12" >&2
  exit 1
fi

pyenv_root="${PYENV_ROOT:-}"
if [ -z "$pyenv_root" ] && command -v pyenv >/dev/null 2>&1; then
  pyenv_root="$(pyenv root 2>/dev/null)"
fi
[ -n "$pyenv_root" ] || pyenv_root="$HOME/.pyenv"

for minor in 12 13; do
  candidate="$(command -v "python3.$minor" 2>/dev/null)"
  if ok "$candidate"; then echo "$candidate"; exit 0; fi
  # Newest patch release first.
  for candidate in $(ls -d "$pyenv_root"/versions/3."$minor".* 2>/dev/null | sort -V -r); do
    if ok "$candidate/bin/python3"; then echo "$candidate/bin/python3"; exit 0; fi
  done
done
candidate="$(command -v python3 2>/dev/null)"
if ok "$candidate"; then echo "$candidate"; exit 0; fi

cat >&2 <<'MSG'
pcgopt needs Python 3.12 or later (its e-graph engine, egglog 14, requires it), and none was
found: not python3.12 or python3.13 on PATH, not in pyenv, and python3 is older.
Install one, for example:
  pyenv install 3.12          (with pyenv)
  apt install python3.12      (Debian/Ubuntu with a recent release)
or point pcgopt at an existing one:
  export PCGOPT_PYTHON=/path/to/python3.12
MSG
exit 1
