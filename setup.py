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
import glob
import os
import re
import shlex
import shutil
import subprocess

from setuptools import Extension, setup
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


# The executor's C core, by part (csrc/common/pc_common.h draws who may
# include whom; tests/layout_rules.py keeps it so).  Headers are included
# with their part ("sched/pc_sched.h") from the one include directory csrc/:
# a directory per part would let a header called sched.h shadow the
# system's <sched.h>.
CORE = {
    "common": ["common.c", "trace.c"],
    "transport": ["transport_mpi.c", "netem.c", "netem_send.c",
                  "netem_shm.c", "netem_model.c", "netem_config.c"],
    "sched": ["build.c", "callbacks.c", "sched.c", "types.c", "device.c"],
    "engine": ["engine.c", "wait.c", "round.c", "inflight.c", "wire.c",
               "ctrl.c", "timers.c"],
    "python": ["module.c", "pycapi.c", "pysched.c", "pysync.c",
               "pyattrs.c", "pypark.c", "pyerrors.c"],
}
# every header (the sdist gets them through depends)
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True))

ext = Extension(
    "partialcoll._core",
    sources=[f"csrc/{part}/{f}" for part, files in CORE.items()
             for f in files],
    include_dirs=["csrc"],
    depends=[h for h in HEADERS if not h.startswith("csrc/mlfabric/")],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-braces",
                        "-D_GNU_SOURCE"],
    # site-packages/partialcoll -> <prefix>/lib, where the mpich wheel lives
    libraries=["dl", "rt"],
    extra_link_args=["-pthread", "-Wl,-rpath,$ORIGIN/../../.."],
)

# MLfabric's scheduler: its link model's hot loops in C (no MPI, nothing
# of the executor's; the Python versions in
# partialcoll/mlfabric/scheduler/links.py are the fallback)
linkops = Extension(
    "partialcoll.mlfabric.scheduler._linkops",
    sources=["csrc/mlfabric/linkops.c", "csrc/mlfabric/linkops_agg.c"],
    include_dirs=["csrc"],
    depends=[h for h in HEADERS if h.startswith("csrc/mlfabric/")],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-ffp-contract=off"],
)

# The partial collectives' blocking call in C, on the executor's C API
# (csrc/capi/pc_capi.h, a capsule of partialcoll._core): no MPI, nothing
# of the executor's headers (rounds.py has the same protocol in Python)
calls = Extension(
    "partialcoll.collectives.partial._calls",
    sources=["csrc/partial/calls.c", "csrc/partial/book.c"],
    include_dirs=["csrc"],
    depends=["csrc/capi/pc_capi.h", "csrc/partial/book.h"],
    extra_compile_args=["-O2", "-std=c11", "-Wall"],
)

install_requires = ["mpi4py>=4.0", "numpy>=1.23", "jsonschema>=4"]
if not os.environ.get("MPICC"):
    install_requires.append("mpich; sys_platform == 'linux'")


def long_description():
    """The README for the package index: its figures and its links to
    files of the repository, which an index page cannot follow, become
    plain text."""
    if not os.path.exists("README.md"):
        return ""
    with open("README.md") as f:
        text = f.read()
    text = re.sub(r"!\[[^\]]*\]\((?!https?:)[^)]*\)\n?", "", text)   # figures
    return re.sub(r"\[([^\]]+)\]\((?!https?:|#)[^)]*\)", r"\1", text)


# Metadata, extras and the console script are in pyproject.toml.
setup(
    long_description=long_description(),
    long_description_content_type="text/markdown",
    ext_modules=[ext, linkops, calls],
    cmdclass={"build_ext": BuildExt},
    install_requires=install_requires,
)
