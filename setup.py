"""Build partialcoll's C executor against the MPI that mpi4py uses.

MPI discovery, in order:
  1. ``MPICC`` (environment): a system MPI's compiler wrapper;
  2. ``mpicc`` on ``PATH`` (in an isolated ``pip install .`` this is the one
     from the ``mpich`` wheel in pip's temporary build environment).

The extension is linked against ``libmpi`` by soname only.  The build
environment's library directory is *not* recorded as an rpath (pip deletes it
after the build); at run time ``partialcoll`` imports ``mpi4py.MPI`` first,
which has already loaded ``libmpi``, and the loader reuses it.  A relative
rpath to the ``mpich`` wheel's ``lib/`` in the same environment is added as a
fallback.
"""
import os
import shlex
import shutil
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


def mpi_flags():
    mpicc = os.environ.get("MPICC") or shutil.which("mpicc")
    if not mpicc:
        raise SystemExit(
            "partialcoll: no MPI compiler wrapper found. Install the 'mpich' "
            "wheel (pip install mpich) or point MPICC at your MPI's mpicc.")
    for flag in ("-show", "--showme", "-showme"):
        try:
            out = subprocess.run(shlex.split(mpicc) + [flag], check=True,
                                 capture_output=True, text=True).stdout
            break
        except (subprocess.CalledProcessError, OSError):
            out = None
    if not out:
        raise SystemExit(f"partialcoll: cannot query {mpicc} for its flags")
    inc, libdirs, libs = [], [], []
    for tok in shlex.split(out)[1:]:
        if tok.startswith("-I"):
            inc.append(tok[2:])
        elif tok.startswith("-L"):
            libdirs.append(tok[2:])
        elif tok.startswith("-l"):
            libs.append(tok[2:])
    # -Wl,-rpath entries are dropped on purpose (see module docstring)
    return inc, libdirs, libs or ["mpi"]


class BuildExt(build_ext):
    def build_extensions(self):
        inc, libdirs, libs = mpi_flags()
        for ext in self.extensions:
            if ext.name != "partialcoll._core":
                continue            # only the executor talks to MPI
            ext.include_dirs += inc
            ext.library_dirs += libdirs
            ext.libraries += libs
        super().build_extensions()


ext = Extension(
    "partialcoll._core",
    sources=[f"csrc/{f}" for f in (
        "pc_module.c", "pc_pysched.c", "pc_pyattrs.c", "pc_sched.c",
        "pc_round.c", "pc_inflight.c", "pc_engine.c", "pc_timers.c",
        "pc_wire.c", "pc_transport_mpi.c", "pc_netem.c",
        "pc_netem_model.c", "pc_timeline.c", "pc_types.c", "pc_device.c")],
    depends=[f"csrc/{f}" for f in ("pc_sched.h", "pc_device.h",
                                    "pc_transport.h", "pc_engine_int.h",
                                    "pc_module.h", "pc_netem.h",
                                    "pc_round.h")],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-braces",
                        "-D_GNU_SOURCE"],
    # site-packages/partialcoll -> <prefix>/lib, where the mpich wheel lives
    libraries=["dl", "rt"],
    extra_link_args=["-pthread", "-Wl,-rpath,$ORIGIN/../../.."],
)

# MLfabric's scheduler: its link model's hot loops in C (no MPI; the
# Python versions in partialcoll/mlfabric/scheduler/links.py are the
# fallback)
linkops = Extension(
    "partialcoll.mlfabric.scheduler._linkops",
    sources=["csrc/mlfabric/linkops.c", "csrc/mlfabric/linkops_agg.c"],
    depends=["csrc/mlfabric/linkops.h"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-ffp-contract=off"],
)

install_requires = ["mpi4py>=4.0", "numpy>=1.23"]
if not os.environ.get("MPICC"):
    install_requires.append("mpich; sys_platform == 'linux'")

setup(
    name="partialcoll",
    version="0.1.0",
    description="Partial collective operations (solo, majority, quorum "
                "allreduce) over MPI, with an asynchronous C schedule executor",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["partialcoll", "partialcoll.*"]),
    ext_modules=[ext, linkops],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.9",
    install_requires=install_requires,
    entry_points={"console_scripts": [
        "partialcoll-bench = partialcoll.bench.__main__:main"]},
    extras_require={
        "test": ["pytest", "pytest-mpi", "matplotlib", "scikit-learn",
                 "threadpoolctl"],
        # the API reference: sphinx-build -W --keep-going -b html docs
        # docs/_build/html
        "docs": ["sphinx>=7", "furo"],
        "bench": ["tqdm", "matplotlib", "scikit-learn", "threadpoolctl"],
        "torch": ["torch"],
        # TicTac's traced models (partialcoll.scheduling.graphs); pick the
        # torchvision that matches your torch
        "vision": ["torch", "torchvision"],
        # CuPy's binary wheels are per CUDA major version; pick yours
        "cuda": ["cupy-cuda12x"],
    },
)
