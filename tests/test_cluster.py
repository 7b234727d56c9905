"""The cluster in a box (tests/cluster.py): hosts with their own hostname,
/dev/shm and clocks, and nothing left behind however a run ends."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "cluster.py")
DAY = 86400


def cluster(*args, timeout=120):
    return subprocess.run([sys.executable, CLUSTER, *args],
                          capture_output=True, text=True, timeout=timeout)


#: how long the ranks of the failed runs below sleep (a number no other
#: process uses, so that they can be found)
NAP = "61.25"


def leftovers():
    """Processes and state a cluster run could leave: holders (their
    arguments name the hosts), mpiexec and its proxies (theirs name
    cluster_ssh), the ranks of the runs below (sleep NAP), state
    folders."""
    out = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True,
                         text=True).stdout.splitlines()
    procs = [ln for ln in out
             if not ln.startswith("Z") and
             ("pc-host" in ln or "cluster_ssh" in ln or
              "partialcoll-cluster" in ln or f"sleep {NAP}" in ln)]
    state = [n for n in os.listdir(tempfile.gettempdir())
             if n.startswith("partialcoll-cluster-")]
    return procs, state


def wait_clean(deadline=10):
    t = time.monotonic() + deadline
    while time.monotonic() < t:
        procs, _ = leftovers()
        if not procs:
            return
        time.sleep(0.2)


def test_hosts_have_their_own_hostname_shm_and_clock():
    job = ("touch /dev/shm/cluster-test-$PMI_RANK; sleep 1; "
           "echo $(hostname) $PMI_RANK $(cut -d' ' -f1 /proc/uptime) "
           "$(ls -A /dev/shm | grep -c cluster-test); sleep 1; "
           "rm /dev/shm/cluster-test-$PMI_RANK")
    r = cluster("--hosts", "2", "--per-host", "2", "--", "sh", "-c", job)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()
            if ln.startswith("pc-host")]
    assert len(rows) == 4
    by_rank = {int(row[1]): row for row in rows}
    assert [by_rank[k][0] for k in range(4)] == \
        ["pc-host0", "pc-host0", "pc-host1", "pc-host1"]
    # the second host's clocks are a day ahead of the first's
    up = [float(by_rank[k][2]) for k in range(4)]
    assert abs(up[2] - up[0] - DAY) < 5 and abs(up[1] - up[0]) < 5
    # a rank sees its own host's /dev/shm: its file and its neighbour's,
    # never those of the other host's ranks
    assert [int(row[3]) for row in rows] == [2, 2, 2, 2], rows
    wait_clean()
    assert leftovers() == ([], [])


def test_a_leaked_segment_fails_the_run():
    r = cluster("--hosts", "2", "--per-host", "1", "--",
                "sh", "-c", "touch /dev/shm/leak-$PMI_RANK")
    assert r.returncode != 0
    assert "left 1 file(s) in pc-host0's /dev/shm: leak-0" in r.stdout
    wait_clean()
    assert leftovers() == ([], [])


def test_unreceived_message_warnings_fail_the_run():
    r = cluster("--hosts", "1", "--per-host", "1", "--", "sh", "-c",
                "echo 'UCX WARN unexpected tag-receive descriptor 0x1 was "
                "not matched'")
    assert r.returncode != 0
    assert "1 message(s) were never received" in r.stdout


@pytest.mark.parametrize("how", ["time limit", "killed"])
def test_nothing_is_left_after_a_failed_run(how):
    """A job past its time limit, and the script itself killed (SIGKILL):
    no holder, proxy, rank or state folder remains."""
    if how == "time limit":
        r = cluster("--timeout", "3", "--", "sleep", NAP, timeout=60)
        assert r.returncode == 124
        assert "time limit" in r.stdout
    else:
        p = subprocess.Popen([sys.executable, CLUSTER, "--", "sleep", NAP],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(3)
        assert leftovers()[0], "the cluster did not start"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        # the next run clears the state folder a killed run could not
        assert cluster("--check").returncode == 0
    wait_clean()
    assert leftovers() == ([], [])


def test_a_machine_that_refuses_namespaces_fails_saying_so():
    """Not root: the namespaces are refused; the run fails, never skips."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run as another user")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534",
                        "--clear-groups", sys.executable, CLUSTER, "--check"],
                       capture_output=True, text=True, timeout=60,
                       cwd=tempfile.gettempdir())
    assert r.returncode != 0
    assert "refused the namespaces" in r.stderr, r.stderr


def test_bad_arguments_are_refused():
    r = cluster("--hosts", "0", "--", "true")
    assert r.returncode == 2 and "at least 1" in r.stderr
    r = cluster("--hosts", "2")
    assert r.returncode == 2 and "command" in r.stderr
