// SPDX-License-Identifier: MIT
// process_check: one rank of a multi-process test over tcp_transport (or shm_transport, with
// `--transport shm` before the mode; node_transport with `--transport node:K`, the ranks cut
// into K nodes of consecutive ranks, or `node%K`, rank r on node r % K), started by chorusrun (or by hand with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). The mode says what the job does:
//
//   process_check matrix             every collective x algorithm x op x type x size against
//                                    the oracle (support/collective_matrix.hpp)
//   process_check stress SEED ITERS  randomized allreduce / alltoallv sizes (same sequence on
//                                    every rank), each checked
//   process_check kill R MS          ranks loop over large allreduces; rank R SIGKILLs itself
//                                    MS ms after its first one, mid-collective. The others must
//                                    fail naming R.
//   process_check mismatch           rank 1 passes a different allreduce size than the others
//   process_check absent R           rank R never joins (sleeps): the rendezvous must time out
//   process_check late R MS          rank R joins MS ms late (time for a test to send stray
//                                    connections to the master meanwhile), then `matrix`-lite
//
// Exit status: 0 when every check passed; 1 with "rank r: error: ..." on stderr when a chorus
// error was raised; 2 on wrong results. Every line a test looks for starts with "rank r:".
//
// The modes are templates over the transport; each transport's instantiation (the matrix is
// most of the build) has its own translation unit, process_check_<transport>.cpp, so that a
// 2-core build compiles them side by side.

#pragma once

#include <chorus/chorus.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>      // the insider's 8 GiB of zero pages
#include <sys/resource.h>  // getrusage: peak RSS

#include "../support/collective_matrix.hpp"

using chorus::rank_t;

inline long long epoch_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline int env_rank() {
    char const* r = std::getenv("RANK");
    return r ? std::atoi(r) : 0;
}

template <class Tp>
int report(Tp const& tp, oracle::failures const& f, long checks, char const* what) {
    if (f.count() != 0) {
        std::fprintf(stderr, "rank %d: %zu of %ld %s checks wrong:\n%s", tp.rank(), f.count(), checks, what, f.report().c_str());
        return 2;
    }
    std::printf("rank %d: %s passed (%d ranks)\n", tp.rank(), what, tp.size());
    return 0;
}

// Random sizes from a seed every rank shares; results against closed forms.
template <class Tp>
int stress(Tp& tp, unsigned seed, int iterations) {
    oracle::failures f;
    std::mt19937 gen(seed);
    rank_t const p = tp.size(), me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for (int it = 0; it < iterations; ++it) {
        std::size_t const n = std::uniform_int_distribution<std::size_t>(0, 1u << 17)(gen) >> (gen() % 10);
        std::string const at = " iteration " + std::to_string(it) + " n=" + std::to_string(n);
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<float>(oracle::op_kind::sum, me, i + static_cast<std::size_t>(it));
        chorus::allreduce(tp, v, chorus::sum{});
        oracle::compare(f, "allreduce" + at, v, [&](std::size_t i) {
            return oracle::expected<float>(oracle::op_kind::sum, p, i + static_cast<std::size_t>(it));
        });
        // alltoallv: rank i sends (i + j + it) % 5 * m elements to rank j (zeros included).
        std::size_t const m = n / 16;
        auto const count = [&](rank_t i, rank_t j) { return static_cast<std::size_t>((i + j + it) % 5) * m; };
        auto const element = [&](rank_t i, rank_t j, std::size_t k) { return static_cast<int>(i * 1000003 + j * 1009 + it) + static_cast<int>(k % 997); };
        std::vector<std::size_t> sc(up), rc(up);
        std::vector<int> send, want;
        for (rank_t j = 0; j < p; ++j) {
            sc[static_cast<std::size_t>(j)] = count(me, j);
            rc[static_cast<std::size_t>(j)] = count(j, me);
            for (std::size_t k = 0; k < count(me, j); ++k) send.push_back(element(me, j, k));
        }
        for (rank_t i = 0; i < p; ++i)
            for (std::size_t k = 0; k < count(i, me); ++k) want.push_back(element(i, me, k));
        std::vector<int> recv(want.size(), -1);
        chorus::alltoallv(tp, send, sc, recv, rc);
        oracle::compare(f, "alltoallv" + at, recv, [&](std::size_t x) { return want[x]; });
    }
    return report(tp, f, 2L * iterations, "stress");
}

// The victim raises `sig` against itself `ms` after its first allreduce: SIGKILL (a crash) or
// SIGSTOP (a stopped or hung process, which never exits by itself).
template <class Tp>
int signal_mid(Tp& tp, rank_t victim, int ms, int sig) {
    std::printf("rank %d: in the allreduce loop\n", tp.rank());
    std::fflush(stdout);
    std::vector<float> v(1u << 20, 1.0f);  // 4 MiB: each allreduce takes a while
    for (long i = 0;; ++i) {
        chorus::allreduce<chorus::ring>(tp, v, chorus::maximum{});
        // The clock starts once the first allreduce is done (slow under a sanitizer), so the
        // victim dies in the middle of a later one.
        if (i == 0 && tp.rank() == victim) {
            std::thread([ms, victim, sig] {
                std::this_thread::sleep_for(std::chrono::milliseconds(ms));
                std::printf("rank %d: %s myself at %lld ms\n", victim, sig == SIGKILL ? "killing" : "stopping", epoch_ms());
                std::fflush(stdout);
                std::raise(sig);
            }).detach();
        }
    }
}


// Rank 1 announces an 8 GiB message to rank 0 that no receive takes (its pages are the zero
// page: no memory), then every rank reports to rank 0, rank 1 first. Rank 0 must not allocate
// it, and its wait for rank 1's report, held behind it, must name rank 1.
template <class Tp>
int insider(Tp& tp) {
    std::vector<int> v{tp.rank()};
    std::optional<typename Tp::request> huge;
    if (tp.rank() == 1) {
        std::size_t const bytes = std::size_t{8} << 30;
        void* zeros = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (zeros == MAP_FAILED) throw std::runtime_error("mmap of 8 GiB failed");
        huge.emplace(tp.isend(0, 999, {static_cast<std::byte const*>(zeros), bytes}));
    }
    // Every wait but rank 0's starts a second late, so rank 0's times out first and names the
    // cause; a wait of ours, with the same timeout, would only name rank 0. That includes rank
    // 1's send of its report, held behind the huge message (it once started a few ms before
    // rank 0's receive under a sanitizer and timed out first).
    if (tp.rank() == 0) {
        for (rank_t r = 1; r < tp.size(); ++r) chorus::recv(tp, r, v, 5);
    } else {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        chorus::send(tp, 0, v, 5);
        chorus::recv(tp, 0, v, 6);  // rank 0's answer never comes
    }
    return 2;
}

inline long peak_rss_mib() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
}

// The command line after the transport: the mode, then its numbers.
struct mode_args {
    int argc;
    char** argv;
    int operator()(int i, int fallback) const { return argc > i ? std::atoi(argv[i]) : fallback; }
};

// What a rank does in `mode`, over any transport.
template <class Tp>
int run(Tp& tp, std::string const& mode, mode_args const& arg) {
    if (mode == "matrix") {
        oracle::failures f;
        checks::all(tp, f);
        chorus::barrier(tp);
        return report(tp, f, 0, "matrix");
    }
    if (mode == "stress") return stress(tp, static_cast<unsigned>(arg(2, 1)), arg(3, 50));
    if (mode == "late") return stress(tp, 7, 10);
    if (mode == "kill") return signal_mid(tp, arg(2, 1), arg(3, 300), SIGKILL);
    if (mode == "stop") return signal_mid(tp, arg(2, 1), arg(3, 300), SIGSTOP);
    if (mode == "insider") return insider(tp);
    if (mode == "loop") return signal_mid(tp, -1, 0, 0);  // until the group fails
    if (mode == "early") {  // the victim returns after the first allreduce; the others do another
        std::vector<double> v(1000, 1.0);
        chorus::allreduce(tp, v, chorus::sum{});
        if (tp.rank() == arg(2, 1)) {
            std::printf("rank %d: leaving early at %lld ms\n", tp.rank(), epoch_ms());
            return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(arg(3, 300)));
        chorus::allreduce(tp, v, chorus::sum{});
        std::printf("rank %d: the second allreduce returned\n", tp.rank());
        return 2;
    }
    if (mode == "mismatch") {
        std::vector<double> v(tp.rank() == 1 ? 1001 : 1000, 1.0);
        chorus::allreduce<chorus::ring>(tp, v, chorus::sum{});
        std::printf("rank %d: the mismatched allreduce returned\n", tp.rank());
        return 2;
    }
    if (mode == "mismatch_auto") {  // rank 1 passes arg 3 elements, the others arg 2; the automatic choice
        std::vector<double> v(static_cast<std::size_t>(tp.rank() == 1 ? arg(3, 9) : arg(2, 8)), 1.0);
        chorus::allreduce(tp, v, chorus::sum{});
        std::printf("rank %d: the mismatched allreduce returned\n", tp.rank());
        return 2;
    }
    if (mode == "mismatch_group") {  // mismatch_auto over a sub-group of every rank in reverse order, rank 0 (its last) the odd one
        auto g = chorus::split(tp, 0, -tp.rank());
        std::vector<double> v(static_cast<std::size_t>(tp.rank() == 0 ? arg(3, 9) : arg(2, 8)), 1.0);
        chorus::allreduce(*g, v, chorus::sum{});
        std::printf("rank %d: the mismatched allreduce returned\n", tp.rank());
        return 2;
    }
    std::fprintf(stderr, "process_check: unknown mode '%s'\n", mode.c_str());
    return 64;
}

// Joins the group over one transport (from the launcher's variables) and runs `mode`.
int run_tcp(std::string const& mode, mode_args const& arg);
int run_shm(std::string const& mode, mode_args const& arg);
int run_node(std::string const& transport, std::string const& mode, mode_args const& arg);
