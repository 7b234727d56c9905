#!/usr/bin/env python3
"""A cluster in a box: K emulated hosts on this machine, for running MPI
jobs across hosts without a cluster.

Each host is a set of Linux namespaces held by one process:

* its own hostname (UTS namespace), so MPICH's hydra and Open MPI place
  ranks on different nodes and move their messages through the network
  module (UCX, OFI, TCP) instead of shared memory; every host's name
  resolves to the loopback address inside the hosts (their /etc/hosts);
* its own ``/dev/shm`` (a tmpfs in its own mount namespace), so nothing
  that one host maps in shared memory is seen by another;
* its own ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` (time namespace),
  ``--offset`` seconds apart from host to host (a day by default), as the
  clocks of different machines are;
* its own process IDs (PID namespace): when the holder ends, every process
  left on the host ends with it.

The loopback network is shared, as a cluster's network is.  mpiexec runs
outside the hosts and starts its proxies on them through ``cluster_ssh``, a
stand-in for ssh that enters the host's namespaces (MPICH hydra:
``-launcher ssh -launcher-exec``; Open MPI: ``plm_rsh_agent``).

Everything is torn down at exit, whatever happens (normal exit, failure,
time limit, Ctrl-C, or this script killed: the holders die with it through
PR_SET_PDEATHSIG): no namespace holder, no segment and no process is left
behind.  If the machine refuses namespaces (not root, or a kernel without
time namespaces), the script says so and fails; it never skips.

Usage::

    python cluster.py [--hosts 2] [--per-host 2] [--netmod ucx|ofi]
                      [--offset 86400] [--timeout 300] -- COMMAND...

runs ``mpiexec -n HOSTS*PER_HOST ... COMMAND`` across the hosts, then checks
that every host's ``/dev/shm`` is empty (a segment left there is a leak of
the job: the run fails).  ``python cluster.py --check`` only builds the
hosts, prints each one's hostname and clock offset, and tears them down.
"""
import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SSH = os.path.join(HERE, "cluster_ssh")
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn: this child gets SIGKILL when the script ends, however it
    ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Host:
    """One emulated host: a holder process in new UTS, mount, time and PID
    namespaces, with its hostname set and a private tmpfs on /dev/shm."""

    def __init__(self, name, offset, state):
        self.name = name
        self.offset = offset
        hosts = os.path.join(state, "hosts")
        script = (f"hostname {name} && "
                  f"mount --bind {hosts} /etc/hosts && "
                  "mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm && "
                  "echo ready && exec sleep infinity")
        cmd = ["unshare", "--uts", "--mount", "--pid", "--fork",
               "--mount-proc", "--kill-child",
               "--time", "--monotonic", str(offset),
               "--boottime", str(offset), "sh", "-c", script]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            err = self.proc.stderr.read().strip()
            self.proc.kill()
            raise SystemExit(
                f"cluster: this machine refused the namespaces of an "
                f"emulated host ({err or 'no reason given'}); the cluster "
                "runs need root and a kernel with UTS, mount, PID and time "
                "namespaces (Linux 5.6 or later)")
        # the holder's child (sleep) is PID 1 of the host: enter through it
        self.pid = self._inner_pid()
        with open(os.path.join(state, name), "w") as f:
            f.write(str(self.pid))

    def _inner_pid(self):
        for _ in range(200):
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}"
                          "/children") as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            time.sleep(0.01)
        raise SystemExit(f"cluster: host {self.name} did not start")

    def run(self, *argv, **kw):
        """Run ``argv`` on this host; return the CompletedProcess."""
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "--uts", "--mount", "--time",
             "--pid", "--"] + list(argv),
            capture_output=True, text=True, timeout=30, **kw)

    def shm(self):
        """The files in this host's /dev/shm (None: the host is gone, torn
        down after a time limit or died during the run)."""
        if self.proc.poll() is not None:
            return None
        out = self.run("ls", "-A", "/dev/shm")
        return out.stdout.split()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _clear_stale_state():
    """Remove the state folders of runs killed before they could (SIGKILL):
    their hosts died with them, only the folder of pid files is left."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if not name.startswith("partialcoll-cluster-"):
            continue
        pid = name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def _alive(pid):
    """A running process (not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Cluster:
    def __init__(self, n, offset):
        _clear_stale_state()
        self.state = tempfile.mkdtemp(
            prefix=f"partialcoll-cluster-{os.getpid()}-")
        self.hosts = []
        try:
            # every host's name resolves (to the shared loopback), as a
            # cluster's names do: seen by the hosts, not by this machine
            names = " ".join(f"pc-host{i}" for i in range(n))
            try:
                with open("/etc/hosts") as f:
                    base = f.read()
            except OSError:
                base = "127.0.0.1 localhost\n"
            with open(os.path.join(self.state, "hosts"), "w") as f:
                f.write(base.rstrip("\n") + f"\n127.0.0.1 {names}\n")
            for i in range(n):
                self.hosts.append(Host(f"pc-host{i}", i * offset,
                                       self.state))
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for h in self.hosts:
            h.stop()
        shutil.rmtree(self.state, ignore_errors=True)

    def env(self):
        e = dict(os.environ)
        e["PARTIALCOLL_CLUSTER_STATE"] = self.state
        return e

    def mpiexec(self, per_host, command):
        hosts = ",".join(f"{h.name}:{per_host}" for h in self.hosts)
        return ["mpiexec", "-hosts", hosts, "-launcher", "ssh",
                "-launcher-exec", SSH, "-n", str(per_host * len(self.hosts))
                ] + command


#: what a network module prints for a message nobody received
LEAK = ("was not matched",)


def run_job(cmd, env, timeout, on_timeout=None):
    """Run the MPI job, echoing its output; (exit status, count of
    unreceived-message warnings).  124: past the time limit (the job is
    killed: mpiexec ends its proxies, the hosts' teardown the rest)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1,
                            preexec_fn=_die_with_parent)
    leaks = 0
    fired = threading.Event()

    def kill(*_):
        fired.set()
        proc.kill()
        if on_timeout is not None:       # whatever still holds the output
            on_timeout()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            leaks += any(w in line for w in LEAK)
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if fired.is_set():
        print(f"cluster: the job ran past its time limit of {timeout:g} s",
              flush=True)
        rc = 124
    return rc, leaks


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2, help="emulated hosts")
    ap.add_argument("--per-host", type=int, default=2,
                    help="MPI ranks on each host")
    ap.add_argument("--netmod", choices=("ucx", "ofi"), default=None,
                    help="MPICH's network module (default: MPICH's choice)")
    ap.add_argument("--offset", type=int, default=86400,
                    help="seconds between the clocks of successive hosts")
    ap.add_argument("--timeout", type=float, default=300,
                    help="time limit of the MPI job, seconds")
    ap.add_argument("--check", action="store_true",
                    help="build the hosts, print them, tear them down")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="the command every rank runs (after --)")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.hosts < 1 or a.per_host < 1:
        ap.error("--hosts and --per-host must be at least 1")
    if not a.check and not command:
        ap.error("give the command to run after --")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        raise SystemExit("cluster: unshare and nsenter (util-linux) are "
                         "needed to emulate hosts")
    cluster = Cluster(a.hosts, a.offset)
    # SIGTERM (a time limit around this script) tears down as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if a.check:
            for h in cluster.hosts:
                name = h.run("hostname").stdout.strip()
                up = h.run("cat", "/proc/uptime").stdout.split()[0]
                print(f"{h.name}: hostname {name}, offset {h.offset} s, "
                      f"uptime {up} s")
            return 0
        env = cluster.env()
        if a.netmod:
            env["MPIR_CVAR_CH4_NETMOD"] = a.netmod
        cmd = cluster.mpiexec(a.per_host, command)
        print(f"cluster: {a.hosts} hosts x {a.per_host} ranks"
              + (f" over {a.netmod}" if a.netmod else "")
              + f", clocks {a.offset} s apart: {' '.join(command)}",
              flush=True)
        env.setdefault("PARTIALCOLL_TEST_LOGS",
                       f"cluster-{a.netmod or 'default'}-"
                       f"{a.hosts}x{a.per_host}")
        rc, leaks = run_job(cmd, env, a.timeout, cluster.stop)
        if leaks:
            # UCX names each message that arrived and was never received:
            # a leak of library messages (none may remain at finalize)
            print(f"cluster: {leaks} message(s) were never received "
                  f"(the network module's warnings above)", flush=True)
            rc = rc or 1
        for h in cluster.hosts:
            left = h.shm()
            if left is None:
                if rc != 124:            # not torn down by the time limit
                    print(f"cluster: host {h.name} ended during the run",
                          flush=True)
                    rc = rc or 1
            elif left:
                print(f"cluster: the job left {len(left)} file(s) in "
                      f"{h.name}'s /dev/shm: {' '.join(left)}", flush=True)
                rc = rc or 1
        return rc
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
