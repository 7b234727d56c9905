"""The scripts in examples/ run: a few steps each under ``mpiexec -n 2``
(single-process tests that start mpiexec themselves), checking the exit
code and what the script says it did."""
import importlib.util
import os

import pytest

from conftest import ROOT, run_mpi

EXAMPLES = os.path.join(ROOT, "examples")
TIMEOUT = 120          # seconds per run; a few steps take a few seconds

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed (pip install 'partialcoll[torch]')")


def run_example(script, *args, n=2):
    rc, out, err, _ = run_mpi(["python", "-m", "mpi4py",
                               os.path.join(EXAMPLES, script)]
                              + [str(a) for a in args], n=n, timeout=TIMEOUT)
    assert rc != 124, f"{script} timed out after {TIMEOUT} s\n{out}\n{err}"
    assert rc == 0, f"{script} exited {rc}\n{out}\n{err}"
    return out


def refused(script, *args, n=2):
    """Run ``script`` with bad arguments: it must exit non-zero (not time
    out); returns what it wrote to stderr."""
    rc, out, err, _ = run_mpi(["python", "-m", "mpi4py",
                               os.path.join(EXAMPLES, script)]
                              + [str(a) for a in args], n=n, timeout=TIMEOUT)
    assert rc not in (0, 124), f"{script} exited {rc}\n{out}\n{err}"
    return err


def test_every_example_is_listed_in_its_readme():
    with open(os.path.join(EXAMPLES, "README.md")) as f:
        readme = f.read()
    scripts = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))
    assert scripts, "no examples found"
    for script in scripts:
        assert f"python -m mpi4py examples/{script}" in readme, script


def test_solo_allreduce_example():
    out = run_example("solo_allreduce_mpi4py.py", "--steps", 8)
    assert "step 0: data[0]=" in out
    assert "every contribution received exactly once: True" in out


def test_solo_allreduce_example_refuses_a_bad_rank():
    err = refused("solo_allreduce_mpi4py.py", "--slow-rank", 7)
    assert "--slow-rank must be in 0..1" in err


@needs_torch
def test_horovod_port_example():
    """A Horovod script with only its import changed: the loss falls and
    the replicas end equal."""
    out = run_example("horovod_port.py", "--epochs", 3)
    losses = [float(line.split("loss ")[1].split()[0])
              for line in out.splitlines() if line.startswith("epoch ")]
    assert len(losses) == 3 and losses[-1] < losses[0] / 4, out
    assert "replicas agree: True" in out, out
    with open(os.path.join(EXAMPLES, "horovod_port.py")) as f:
        source = f.read()
    assert "import horovod" not in source.replace(
        "-import horovod.torch as hvd", "")


@needs_torch
def test_horovod_style_example_saves_then_resumes(tmp_path):
    import torch
    ckpt = tmp_path / "ckpt.pt"
    out = run_example("horovod_style_torch.py", "--steps", 6,
                      "--log-every", 3, "--checkpoint", ckpt)
    assert "resumed" not in out
    assert "step 6: loss" in out
    assert f"saved checkpoint {ckpt} at step 6" in out
    assert "mode solo: 6 steps" in out and "straggler report: slowest rank" \
        in out
    # again: rank 0 loads it, the others get it by broadcast, and the
    # step count goes on from there
    out = run_example("horovod_style_torch.py", "--steps", 6,
                      "--log-every", 3, "--checkpoint", ckpt,
                      "--mode", "sync")
    assert f"resumed from {ckpt} at step 6" in out
    assert "step 12: loss" in out
    assert f"saved checkpoint {ckpt} at step 12" in out
    state = torch.load(ckpt, weights_only=True)
    assert state["step"] == 12
    assert all("momentum_buffer" in s
               for s in state["optimizer"]["state"].values())


@needs_torch
def test_ddp_hook_example():
    out = run_example("ddp_hook.py", "--steps", 6, "--log-every", 3)
    assert "step 6: loss" in out
    assert "mode solo: 6 steps" in out
    assert "straggler report: slowest rank" in out


@needs_torch
def test_mlfabric_example_compares_modes_on_one_network():
    out = run_example("mlfabric_torch.py", "--duration", 3, "--tau-max", 4,
                      n=4)
    assert "3 workers" in out
    lines = {m: [ln for ln in out.splitlines() if ln.startswith(m + ":")]
             for m in ("mlfabric", "async")}
    assert all(len(v) == 1 for v in lines.values()), out
    for mode, (line,) in lines.items():
        first, last = (float(x) for x in
                       line.split("loss ")[1].split(" in ")[0].split(" -> "))
        assert last < first, line          # the model learned
    # the delay bound held, and the run's own checks are all clean
    assert "(tau_max 4)" in out
    delay = int(out.split("largest delay ")[1].split(" ")[0])
    assert delay <= 4, out
    assert out.count("run checks: all clean") == 2, out
    assert "time to loss" in out
    assert "every rank holds the server's model: True" in out


def test_mlfabric_example_refuses_a_bad_mode():
    err = refused("mlfabric_torch.py", "--modes", "mlfabric,sync")
    assert "--modes takes" in err and "sync" in err
