#!/usr/bin/env bash
# busbw against size for chorus (auto), Gloo (best algorithm), Open MPI TCP and shared memory,
# one panel per (collective, ranks), from compare.sh's raw rows. Usage: plot.sh OUT_DIR
set -euo pipefail
out=$1
data=$out/plot-data
mkdir -p "$data"
rm -f "$data"/*.dat
# One file per (op, ranks, library): bytes busbw, the best over a library's algorithms.
awk -v dir="$data" '
    FNR == 1 { file++ }
    /^#/ || /^ceiling/ || NF < 9 || $1 == "barrier" { next }
    {
        l = file == 1 ? (($2 == "mpi_tcp" || $2 == "mpi_shm") ? $2 : "gloo") : ($2 == "auto" ? "chorus" : "")
        if (l == "" || $4 + 0 == 0) next
        k = $1 "-" $3 "-" l SUBSEP $4
        if (!(k in best) || $8 + 0 > best[k]) best[k] = $8
    }
    END { for (k in best) { split(k, a, SUBSEP); print a[2], best[k] >> (dir "/" a[1] ".dat") } }
' "$out/peers.txt" "$out/chorus.txt"
for f in "$data"/*.dat; do sort -n -o "$f" "$f"; done
ops=$(ls "$data" | sed 's/-[0-9]*-[a-z_]*\.dat$//' | sort -u)
ranks=$(ls "$data" | sed 's/^[a-z_]*-\([0-9]*\)-.*/\1/' | sort -un)
nops=$(echo "$ops" | wc -w)
nranks=$(echo "$ranks" | wc -w)
{
    echo "set terminal pngcairo noenhanced size $((420 * nranks)),$((300 * nops)) font ',9'"
    echo "set output '$out/compare-busbw.png'"
    echo "set multiplot layout $nops,$nranks title 'busbw (GB/s) against bytes per rank, loopback, one run (fastest round)'"
    echo "set logscale x 2; set format x '%.0s%cB'; set key top left; set grid"
    for op in $ops; do
        for r in $ranks; do
            echo "set title '$op, $r ranks'"
            plot="plot"
            for l in chorus gloo mpi_tcp mpi_shm; do
                f="$data/$op-$r-$l.dat"
                [ -s "$f" ] && plot="$plot '$f' using 1:2 with linespoints title '$l',"
            done
            echo "${plot%,}"
        done
    done
    echo "unset multiplot"
} | gnuplot
