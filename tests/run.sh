#!/usr/bin/env bash
# The test suite: installs partialcoll with its test extras into a virtual
# environment, runs the single-process tests once, then the MPI tests under
# mpiexec at P = 1 2 3 4 5 8.  Every mpiexec has a time limit so a deadlock
# fails fast.  Usage: bash tests/run.sh   (PARTIALCOLL_VENV picks the venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PARTIALCOLL_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q ".[test]"
export PATH="$PWD/$VENV/bin:$PATH"
cd tests   # import the installed package, not the source tree
status=0
echo "== single-process tests"
timeout 600 pytest -q -m "not mpi" . || status=1
for n in 1 2 3 4 5 8; do
    echo "== MPI tests, P = $n"
    timeout 300 mpiexec -n "$n" pytest -q --with-mpi -m mpi . || status=1
done
exit $status
