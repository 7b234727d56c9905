#!/usr/bin/env bash
# The test suite: installs partialcoll with its test and docs extras into a
# virtual environment, builds the API reference (docs/, warnings are
# errors), runs the single-process tests once, then the MPI tests under
# mpiexec at P = 1 2 3 4 5 8 (tests marked max_ranks(n) skip above n ranks),
# then those that concern communication across emulated hosts.
# Every mpiexec has a time limit so a deadlock
# fails fast.  Usage: bash tests/run.sh   (PARTIALCOLL_VENV picks the venv)
#
# Under mpiexec only rank 0 writes to the console; ranks 1..P-1 write to
# tests/logs/P<P>/rank<r>.log (tests/conftest.py does it).  A failing rank
# still prints its failure to the console before it aborts the others.  The
# logs of a run at P that passed are removed; those of a failed run are kept
# and their last lines printed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PARTIALCOLL_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
VENV=$(cd "$VENV" && pwd)    # absolute: PATH must still hold after cd tests
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q ".[test,docs]"
# PyTorch (CPU build) for the partialcoll.torch tests.  PARTIALCOLL_TORCH is
# the pip requirement to install, or "skip" (those tests then skip, saying
# why).  Pinned: an unpinned "torch" may pull several GB of CUDA packages.
TORCH=${PARTIALCOLL_TORCH:-torch==2.13.0}
if [ "$TORCH" != skip ] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q "$TORCH" ||
        echo "warning: could not install $TORCH: the torch tests will skip"
fi
# torchvision (its model definitions, for the TicTac graphs) matching that
# torch; PARTIALCOLL_TORCHVISION is the requirement, or "skip".
VISION=${PARTIALCOLL_TORCHVISION:-torchvision==0.28.*}
if [ "$VISION" != skip ] && [ "$TORCH" != skip ] &&
        ! "$VENV/bin/python" -c "import importlib.util as u; exit(u.find_spec('torchvision') is None)" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --no-deps "$VISION" ||
        echo "warning: could not install $VISION: the torchvision tests will skip"
fi
export PATH="$VENV/bin:$PATH"
status=0
# The API reference from the docstrings, warnings as errors.  sphinx-build
# (not python -m sphinx, which would put the source tree first on sys.path)
# imports the installed package; tests/test_docs.py then checks that every
# public name is in this build.
echo "== API reference (docs/, Sphinx)"
if timeout 600 sphinx-build -W --keep-going -q -b html docs docs/_build/html; then
    export PARTIALCOLL_DOCS_HTML="$PWD/docs/_build/html"
else
    status=1
fi
cd tests   # import the installed package, not the source tree
echo "== single-process tests"
timeout 600 pytest -q -m "not mpi" . || status=1
rm -rf logs
shm_before=$(mktemp)
trap 'rm -f "$shm_before"' EXIT
# the logs of ranks 1.. of a run that failed: keep them, show their ends
show_logs() {
    for log in logs/"$1"/rank*.log; do
        [ -e "$log" ] || continue
        echo "---- the last 40 lines of tests/$log (kept)"
        tail -n 40 "$log"
        echo
    done
}
for n in 1 2 3 4 5 8; do
    echo "== MPI tests, P = $n (rank 0; ranks 1..$((n - 1)) write tests/logs/P$n/)"
    python shm_segments.py list > "$shm_before"
    if timeout 300 mpiexec -n "$n" pytest -q --with-mpi -m mpi .; then
        rm -rf "logs/P$n"
    else
        status=1
        # an aborted suite leaves MPICH's /dev/shm segment behind
        python shm_segments.py clear "$shm_before"
        show_logs "P$n"
    fi
done
# The suites that concern communication again, across emulated hosts (a
# cluster in a box: Linux namespaces, see tests/cluster.py): messages
# between hosts cross MPICH's network module, each host has its own
# /dev/shm and a clock a day apart.  A machine that refuses namespaces
# fails here; it never skips.  Tests that need the emulated network (one
# host only) skip there, saying so.
ACROSS="test_across_hosts.py test_clock.py test_executor_mpi.py test_allreduce.py
    test_allreduce_pool.py test_partial.py test_partial_contract.py
    test_flush.py test_forms.py test_eager.py test_eager_torch.py
    test_eager_ddp.py test_horovod_broadcast.py test_arrival.py
    test_loadbalance.py test_mlfabric_ps.py test_mlfabric_allreduce.py
    test_mlfabric_torch_ps.py test_tictac_ps.py"
for cfg in "2 2 ucx" "2 2 ofi" "2 4 ucx"; do
    set -- $cfg
    logs="cluster-$3-$1x$2"
    echo "== MPI tests across $1 emulated hosts x $2 ranks over $3 (ranks 1.. write tests/logs/$logs/)"
    # shellcheck disable=SC2086
    if timeout 700 python cluster.py --hosts "$1" --per-host "$2" \
            --netmod "$3" --timeout 600 -- \
            pytest -q -rs --with-mpi -m mpi $ACROSS; then
        rm -rf "logs/$logs"
    else
        status=1
        show_logs "$logs"
    fi
done
rmdir logs 2>/dev/null || true
exit $status
