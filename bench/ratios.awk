# The side-by-side table of bench/compare.sh. Input: the peers' run.sh output, then
# chorus_bench's rows (same columns: op algo ranks bytes count time_us algbw busbw wrong).
# For every (op, ranks, bytes): chorus's automatic choice and its best algorithm, Gloo's best
# algorithm, Open MPI over TCP and over shared memory; then chorus (auto) busbw / peer busbw,
# which for equal bytes is also peer time / chorus time (above 1: chorus is faster). Rows of
# chorus over shared memory (algo shm:NAME, chorus_bench --transport shm) get their own
# columns: chorus_shm (auto), its best algorithm, and the speed-up over Open MPI's shm path;
# then chorus_bench's `registered` rows (the automatic choice on a registered shm_buffer, which
# the peers read where it lies; Open MPI reads ordinary memory) and their speed-up.
# Last, the machine's ceilings from the same run, and chorus's best busbw as a share of them.
# A row that appears several times (compare.sh's rounds) counts with its fastest time, for every
# library alike.
function lib(file, algo) {
    if (file == 1) return algo == "mpi_tcp" || algo == "mpi_shm" ? algo : "gloo"
    if (algo == "shm:registered") return "chorus_shm_reg"
    if (algo ~ /^shm:/) return algo == "shm:auto" ? "chorus_shm" : "chorus_shm_best"
    return algo == "auto" ? "chorus" : "chorus_best"
}
FNR == 1 { file++ }
/^ceiling/ {
    for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        if ($2 == "tcp_stream" && kv[1] == "GBps" && kv[2] > tcp) tcp = kv[2]
        if ($2 == "iperf3_stream" && kv[1] == "GBps") iperf = kv[2]
        if ($2 == "memcpy" && kv[1] == "copy_GBps" && kv[2] > memcpy) memcpy = kv[2]
        if ($2 == "reduce" && kv[1] == "buffer_GBps" && kv[2] > reduce) reduce = kv[2]
        if ($2 == "tcp_pingpong" && kv[1] == "half_rtt_us_median") pingpong = kv[2]
    }
    next
}
/^#/ || NF < 9 { next }
{
    key = $1 SUBSEP $3 SUBSEP $4
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    l = lib(file, $2)
    if ($9 + 0 != 0 && index(wrong[key] " ", " " l ":" $2 "=" $9 " ") == 0) wrong[key] = wrong[key] " " l ":" $2 "=" $9  # once per round would repeat it
    if (!((key, l) in t) || $6 + 0 < t[key, l] + 0) { t[key, l] = $6; bw[key, l] = $8; algo[key, l] = $2 }
    b = $2 ~ /^shm:/ ? "chorus_shm_best" : "chorus_best"
    if (file == 2 && (!((key, b) in t) || $6 + 0 < t[key, b] + 0)) {
        t[key, b] = $6; bw[key, b] = $8; algo[key, b] = $2
    }
    if (file == 2 && $2 !~ /^shm:/ && $8 + 0 > best_bw) best_bw = $8
}
function cell(key, l) { return (key, l) in t ? sprintf("%10.1f", t[key, l]) : sprintf("%10s", "-") }
function ratio(key, l, c) {
    if (c == "") c = "chorus"
    if (!((key, l) in t) || !((key, c) in t) || t[key, c] + 0 == 0) return sprintf("%8s", "-")
    return sprintf("%8.2f", t[key, l] / t[key, c])
}
END {
    printf "# time_us per library (best algorithm for Gloo and chorus_best), then chorus(auto) speed-up = peer time / chorus time = chorus busbw / peer busbw\n"
    printf "%-15s %5s %10s %10s %10s %-19s %10s %-17s %10s %10s %8s %8s %8s %8s %10s %10s %-23s %8s %10s %8s\n", "op", "ranks", "bytes", "chorus", "best", "(algo)", \
        "gloo", "(algo)", "mpi_tcp", "mpi_shm", "chorus_GBps", "x_gloo", "x_mpitcp", "x_mpishm", "chorus_shm", "shm_best", "(algo)", "shm_x_mpishm", \
        "shm_reg", "reg_x_mpishm"
    for (i = 1; i <= n; i++) {
        k = order[i]
        split(k, f, SUBSEP)
        printf "%-15s %5s %10s %s %s %-19s %s %-17s %s %s %8s %s %s %s %s %s %-23s %s %s %s%s\n", f[1], f[2], f[3], cell(k, "chorus"), cell(k, "chorus_best"), \
            "(" algo[k, "chorus_best"] ")", cell(k, "gloo"), "(" algo[k, "gloo"] ")", cell(k, "mpi_tcp"), cell(k, "mpi_shm"), \
            ((k, "chorus") in bw) ? sprintf("%8.3f", bw[k, "chorus"]) : "-", ratio(k, "gloo"), ratio(k, "mpi_tcp"), ratio(k, "mpi_shm"), \
            cell(k, "chorus_shm"), cell(k, "chorus_shm_best"), "(" algo[k, "chorus_shm_best"] ")", ratio(k, "mpi_shm", "chorus_shm"), \
            cell(k, "chorus_shm_reg"), ratio(k, "mpi_shm", "chorus_shm_reg"), (k in wrong) ? "  WRONG:" wrong[k] : ""
    }
    printf "# ceilings (same run): loopback TCP stream %s GB/s (tcp_bench best), iperf3 %s GB/s, 8 B ping-pong half RTT %s us, memcpy %s GB/s, reduce %s GB/s of buffer\n", \
        tcp, iperf, pingpong, memcpy, reduce
    if (iperf + 0 > 0) printf "# chorus's best busbw %.3f GB/s = %.0f%% of the iperf3 loopback stream\n", best_bw, 100 * best_bw / iperf
}
