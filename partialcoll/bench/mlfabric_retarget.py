"""Speed-ups over ring read again from saved loss curves (no MPI).

``partialcoll-bench mlfabric-retarget [--common] [--target-loss L]
[--configs C2-N1,C2-N2,C2-N3] [--scheme mlfabric-2N] CURVES.json ...``

Reads the curves that ``partialcoll-bench mlfabric --curves F.json``
saved ({"C2-N1 seed 0": {scheme: [[seconds, applied, loss], ...]}}), from
one or several runs, keeps the configurations named in ``--configs`` (all
by default), and prints for every configuration and seed the target, each
scheme's time to it and its speed-up over ring, then the median speed-up
of ``--scheme`` per configuration over the seeds.  The targets follow the
benchmark's rules (:func:`partialcoll.bench.mlfabric.targets`): per
configuration by default, one per seed over every kept configuration
with ``--common``, or ``--target-loss``.  So runs made one seed at a time,
or one straggler setting at a time, can be put on one target afterwards.
"""
import json
import math
import statistics
import sys

from ._common import cli, real
from .mlfabric import targets, time_to


def add_args(p):
    p.add_argument("curves", nargs="+", help="files of --curves")
    p.add_argument("--common", action="store_true",
                   help="one target per seed over every kept configuration")
    p.add_argument("--target-loss", type=real(0),
                   help="this target for every configuration")
    p.add_argument("--configs", help="keep these, e.g. C2-N1,C2-N2,C2-N3")
    p.add_argument("--scheme", default="mlfabric-2N",
                   help="the scheme whose median speed-up is printed")


def load(paths, keep=None):
    """{(straggler setting, network, seed): {scheme: {"losses": ...}}} from
    the curves files; a configuration in two files is an error."""
    curves = {}
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        for name, got in saved.items():
            config, _, seed = name.rpartition(" seed ")
            if keep and config not in keep:
                continue
            cname, _, nname = config.partition("-")
            key = (cname, nname, int(seed))
            if key in curves:
                raise SystemExit(f"mlfabric-retarget: {name} is in two "
                                 f"files")
            curves[key] = {scheme: {"losses": [tuple(p) for p in losses]}
                           for scheme, losses in got.items()}
    if not curves:
        raise SystemExit("mlfabric-retarget: no configuration left")
    return curves


def speedups(curves, goal):
    """[(key, target, {scheme: (seconds, speed-up over ring)})]."""
    out = []
    for key in sorted(curves):
        got, target = curves[key], goal[key]
        ring = time_to(got["ring"]["losses"], target)[0] \
            if "ring" in got else math.nan
        out.append((key, target, {
            scheme: (t, ring / t if t == t and t > 0 else math.nan)
            for scheme, r in got.items()
            for t in [time_to(r["losses"], target)[0]]}))
    return out


def run(args):
    if args.common and args.target_loss is not None:
        raise SystemExit("mlfabric-retarget: --common or --target-loss, "
                         "not both")
    keep = set(args.configs.split(",")) if args.configs else None
    curves = load(args.curves, keep)
    rows = speedups(curves, targets(curves, args.target_loss, args.common))
    per = {}
    for (cname, nname, seed), target, got in rows:
        print(f"{cname}-{nname} seed {seed}: target {target:.4f}  " +
              "  ".join(f"{s} {t:.1f} s ({x:.2f}x)"
                        for s, (t, x) in got.items()))
        if args.scheme in got:
            per.setdefault(f"{cname}-{nname}", []).append(
                got[args.scheme][1])
    for config, xs in per.items():
        print(f"{config}: {args.scheme} over ring, median "
              f"{statistics.median(xs):.2f} of "
              f"{', '.join(f'{x:.2f}' for x in xs)}")
    return rows


def main(argv=None):
    return cli(sys.modules[__name__], "mlfabric-retarget", argv)
