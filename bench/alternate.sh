# Sourced by the A/B scripts of bench/: the pairs of runs of two builds
# and the table of their ratios to MPI_Allreduce.
#
# fresh_out: an empty $OUT.
fresh_out() {
    rm -rf "$OUT"
    mkdir -p "$OUT"
}

# each_rank SIDE VENV I PREFIX ARGS...: `partialcoll-bench ARGS` with
# VENV's partialcoll at every P of $RANKS, each under a time limit of
# $LIMIT seconds (default 300), its CSV to $OUT/<PREFIX><P>_<SIDE>_<I>.csv.
each_rank() {
    local side=$1 venv=$2 i=$3 prefix=$4
    shift 4
    for P in $RANKS; do
        PATH="$venv/bin:$PATH" timeout "${LIMIT:-300}" mpiexec -n "$P" \
            partialcoll-bench "$@" \
            --csv "$OUT/$prefix${P}_${side}_$i.csv" > /dev/null
    done
}

# alternate PAIRS BEFORE_VENV AFTER_VENV: calls the script's
# `run SIDE VENV I` (SIDE: before or after) for each of the PAIRS pairs,
# the side that goes first alternating, so that neither build always runs
# on a warm machine.
alternate() {
    for i in $(seq 1 "$1"); do
        if [ $((i % 2)) = 1 ]; then
            run before "$2" "$i"; run after "$3" "$i"
        else
            run after "$3" "$i"; run before "$2" "$i"
        fi
    done
}

# ratios OUT PAIRS PREFIX COLUMN SCALE BY RANKS...: reads
# OUT/<PREFIX><P>_<side>_<i>.csv and prints, per P, value of BY (a CSV
# column, or "-" for none) and build, the median of COLUMN x SCALE (in us)
# of every implementation and the median and range of its ratio to
# MPI_Allreduce's in the same run.
ratios() {
    python3 - "$@" <<'PY'
import csv, statistics, sys
out, pairs, prefix, column, scale, by = sys.argv[1:7]
pairs, scale = int(pairs), float(scale)
for P in sys.argv[7:]:
    for side in ("before", "after"):
        got = {}
        for i in range(1, pairs + 1):
            with open(f"{out}/{prefix}{P}_{side}_{i}.csv") as f:
                rows = list(csv.DictReader(f))
            group = (lambda r: r[by]) if by != "-" else (lambda r: "")
            base = {group(r): float(r[column]) for r in rows
                    if r["impl"] == "MPI_Allreduce"}
            for r in rows:
                v = float(r[column])
                got.setdefault(group(r), {}).setdefault(r["impl"], []).append(
                    (v * scale, v / base[group(r)]))
        for g in sorted(got, key=lambda g: (len(g), g)):
            cells = [f"{k} {statistics.median(t for t, _ in v):.0f} us "
                     f"{statistics.median(x for _, x in v):.2f}x "
                     f"({min(x for _, x in v):.2f}-{max(x for _, x in v):.2f})"
                     for k, v in got[g].items()]
            where = f" {g} B" if g else ""
            print(f"P={P}{where} {side}: " + "; ".join(cells))
PY
}
