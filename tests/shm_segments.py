"""MPICH's shared-memory segments in /dev/shm, and clearing those a failed
job left behind.

MPICH unlinks its segment (``/dev/shm/mpich_shm_*``, about 3 MB) at a clean
exit only, so every aborted job leaves one.  ``tests/conftest.py``'s
``run_mpi`` clears them after each job a test aborts on purpose, and
``tests/run.sh`` after a whole MPI suite that fails.  A segment a live
process still maps belongs to another job running beside this one (two test
suites at once) and is spared.

Command line (for tests/run.sh)::

    python shm_segments.py list > before.txt    # the segments there now
    python shm_segments.py clear before.txt     # clear the new, unmapped ones
"""
import os
import sys
import time

SHM = "/dev/shm"


def segments():
    """The names of MPICH's segments in /dev/shm now."""
    try:
        return {f for f in os.listdir(SHM) if f.startswith("mpich_shm_")}
    except OSError:
        return set()


def stale(names):
    """Those of the /dev/shm segments ``names`` that no live process maps.

    The job that made a segment has exited when this is asked; a segment
    still mapped belongs to another job running beside this one and is left
    alone.  (A segment another job has created but not yet mapped is not
    told apart: a window of microseconds.)"""
    names = set(names)
    if not names:
        return names
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(SHM + "/")
                    if i >= 0:
                        mapped.add(line[i + len(SHM) + 1:]
                                   .split(" (deleted)")[0].strip())
        except OSError:                  # gone, or not ours to read
            continue
    return names - mapped


def clear_new(before, wait=3.0):
    """Unlink the segments made since ``before`` (a set of names) that no
    process maps; return their names.  An aborted job's killed ranks may
    still be exiting, their segment still mapped: wait up to ``wait``
    seconds for them before sparing what is still in use."""
    new, deadline = segments() - set(before), time.monotonic() + wait
    while True:
        gone = stale(new)
        if gone == new or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name in gone:
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass
    return gone


def main(argv):
    if argv[:1] == ["list"] and len(argv) == 1:
        print("\n".join(sorted(segments())))
        return 0
    if argv[:1] == ["clear"] and len(argv) == 2:
        with open(argv[1]) as f:
            before = {line.strip() for line in f if line.strip()}
        for name in sorted(clear_new(before)):
            print(f"removed /dev/shm/{name} (left by the failed run)")
        return 0
    print("usage: python shm_segments.py list | clear BEFORE_FILE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
