#!/usr/bin/env bash
# Build the C core under AddressSanitizer or ThreadSanitizer and run the
# executor, network and partial-collective tests against it at 2 ranks.
#
#   bash tests/sanitize.sh asan      # or: tsan
#
# Uses the virtual environment of tests/run.sh (.venv, or PARTIALCOLL_VENV)
# for Python, mpi4py and pytest; the sanitized extension is built into
# build/<kind> and put first on PYTHONPATH, so nothing installed changes.
# Python and MPICH are not instrumented: the sanitizer runtime is preloaded
# and watches the extension's own code.  Exit status 0 means the tests
# passed and the sanitizer reported nothing (its reports go to
# build/<kind>/report.*).  Not part of CI (slow); results are recorded in
# docs/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:?usage: tests/sanitize.sh asan|tsan}
VENV=${PARTIALCOLL_VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "run tests/run.sh first (it makes $VENV)"; exit 2; }
VENV=$(cd "$VENV" && pwd)    # absolute: PATH must still hold after cd tests
PY=$VENV/bin/python
case "$KIND" in
  asan) FLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1"
        RT=$(gcc -print-file-name=libasan.so)
        export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:log_path=$PWD/build/asan/report:halt_on_error=0" ;;
  tsan) FLAGS="-fsanitize=thread -g -O1"
        RT=$(gcc -print-file-name=libtsan.so)
        # UCX (loaded by the mpich wheel) hooks madvise(); glibc calls it
        # on a thread's way out, after TSan has dropped the thread: without
        # this, exiting threads crash the TSan runtime (import numpy,
        # mpi4py.MPI is enough to see it)
        export UCX_MEM_EVENTS=no
        export TSAN_OPTIONS="log_path=$PWD/build/tsan/report:halt_on_error=0:report_signal_unsafe=0:second_deadlock_stack=1" ;;
  *) echo "usage: tests/sanitize.sh asan|tsan"; exit 2 ;;
esac
OUT=$PWD/build/$KIND
rm -rf "$OUT" && mkdir -p "$OUT/lib"
export PATH="$VENV/bin:$PATH"
CFLAGS="$FLAGS" LDFLAGS="$FLAGS" "$PY" setup.py -q build_ext \
    --build-lib "$OUT/lib" --build-temp "$OUT/tmp" >/dev/null
# every Python subpackage, next to the sanitized extension
for d in partialcoll/*/; do
    [ -e "$d/__init__.py" ] && cp -r "${d%/}" "$OUT/lib/partialcoll/"
done
cp partialcoll/*.py "$OUT/lib/partialcoll/"
# timing tests skip: a sanitizer slows everything down several times
export PYTHONPATH="$OUT/lib" LD_PRELOAD="$RT" PARTIALCOLL_SANITIZED=1
TESTS="test_core_lifecycle.py test_ops_timed.py test_schedule_unit.py
       test_executor_mpi.py test_network.py test_arrival.py test_partial.py
       test_allreduce.py test_netem_model_unit.py test_schedule_input.py
       test_network_reliable.py test_collective_input.py
       test_network_alloc_failure.py test_partial_contract.py
       test_partial_book.py"
cd tests
python -c "import partialcoll._core as c; print('using', c.__file__)"
status=0
timeout 900 python -m pytest -q -p no:cacheprovider -m "not mpi" $TESTS || status=1
timeout 1800 mpiexec -n 2 python -m pytest -q -p no:cacheprovider --with-mpi \
    -m mpi $TESTS || status=1
unset LD_PRELOAD
reports=$(find "$OUT" -maxdepth 1 -name 'report.*' | wc -l)
echo "== $KIND: $reports report file(s) in $OUT"
for f in "$OUT"/report.*; do [ -e "$f" ] && head -40 "$f"; done
[ "$reports" -eq 0 ] || status=1
exit $status
