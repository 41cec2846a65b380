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
//   process_check mix SEED ITERS     random collectives over the group, two splits of it and
//                                    nonblocking ones in flight meanwhile, each checked
//   process_check mix_kill SEED R MS the same until the group fails; rank R SIGKILLs itself MS
//                                    ms after its first iteration. The others must fail naming R.
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
#include <chorus/registration.hpp>
#include <chorus/transport/shm.hpp>  // mix: registered buffers over shared memory

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <type_traits>
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

// The victim raises `sig` (SIGKILL: "killing", SIGSTOP: "stopping") against itself `ms` from
// now, from a thread of its own, saying so first (faults.sh times the others from that line).
inline void signal_self_after(rank_t victim, int ms, int sig) {
    std::thread([ms, victim, sig] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        std::printf("rank %d: %s myself at %lld ms\n", victim, sig == SIGKILL ? "killing" : "stopping", epoch_ms());
        std::fflush(stdout);
        std::raise(sig);
    }).detach();
}

// Random sequences of every kind of call a job mixes (same seed on every rank): blocking
// collectives over the group and over two splits of it, nonblocking ones over the group with a
// split's blocking collective run while they are in flight, each checked against closed forms
// shifted by a random offset per call (a result left from an earlier call is caught). Sizes straddle the
// schedules' thresholds (the shared memory's direct slot of 16 KiB and its remote reads from
// 32 KiB, the hierarchical rails from 64 KiB), so consecutive calls switch between one_shot,
// exposed and message schedules, on the group and on its splits in turn.
// With a victim: it SIGKILLs itself `ms` after its first iteration, and the ranks go on until
// the group fails (every survivor must name it: faults.sh mix_kill).
template <class Tp>
int mix(Tp& tp, unsigned seed, int iterations, rank_t victim = -1, int ms = 0) {
    oracle::failures f;
    std::mt19937 gen(seed);
    rank_t const p = tp.size(), me = tp.rank();
    // Every rank in one of two groups, keys reversed; the upper half (all of a group of one).
    auto parity = chorus::split(tp, me % 2, -me);
    auto upper = chorus::split(tp, me < p / 2 ? chorus::undefined_color : 0, me);
    long checks = 0;
    // Where a call's buffers live: the heap, or over shared memory (each rank choosing for
    // itself, call by call) a registered shm_buffer, which the exposing schedules read where it
    // lies — and where a peer's buffer is not registered, every rank must take the same other
    // way. Bump-allocated, emptied at each iteration (nonblocking calls keep theirs while a
    // split's call runs).
    constexpr std::size_t arena_bytes = 20u << 20;  // a nonblocking pair and a split's call: at most 15 MiB (one rank)
    std::vector<std::byte> heap(arena_bytes);
    std::span<std::byte> shared, arena(heap);
    std::size_t used = 0;
    std::mt19937 own(seed * 7919u + static_cast<unsigned>(me));  // this rank's choices only
    std::optional<chorus::shm_buffer> memory;
    chorus::registration reg;
    if constexpr (std::is_same_v<Tp, chorus::shm_transport>) {
        memory.emplace(arena_bytes);
        shared = memory->template as<std::byte>();
        reg = chorus::register_buffer(tp, shared);
    }
    auto const take = [&]<class T>(std::size_t n, T fill) {
        used = (used + 63) / 64 * 64;
        if (used + n * sizeof(T) > arena.size()) throw std::logic_error("mix: the arena is too small");
        std::span<T> s(reinterpret_cast<T*>(arena.data() + used), n);
        used += n * sizeof(T);
        std::ranges::fill(s, fill);
        return s;
    };
    auto const copy = [](auto s) { return std::vector<std::remove_const_t<typename decltype(s)::element_type>>(s.begin(), s.end()); };
    auto const pick_size = [&](std::size_t unit) -> std::size_t {  // elements of `unit` bytes
        static constexpr std::size_t edges[] = {16 * 1024, 32 * 1024, 64 * 1024};
        switch (gen() % 5) {
        case 0: return std::size_t{gen() % 3};  // 0, 1, 2
        case 1: {
            std::size_t const edge = edges[gen() % 3] / unit;
            return edge + (gen() % 3) - 1;  // just below, at, just above
        }
        case 2: return std::size_t{gen() % 600};
        case 3: return std::size_t{gen() % (96 * 1024 / unit)};
        default: return gen() % 4 == 0 ? std::size_t{gen() % (3 * 1024 * 1024 / unit)} : std::size_t{gen() % 600};  // rings cut in segments
        }
    };
    // One blocking collective of a random kind over `g` (every rank of g calls it, in g's ranks).
    auto const one = [&]<class G>(G& g, std::string const& where) {
        rank_t const q = g.rank(), m = g.size();
        auto const um = static_cast<std::size_t>(m);
        int const kind = static_cast<int>(gen() % 9);
        std::size_t const n = pick_size(kind == 0 || kind == 3 || kind == 6 || kind == 8 ? 4 : kind == 7 ? sizeof(oracle::mat2) : 4 * um);
        auto const shift = static_cast<std::size_t>(gen() % 1000);
        ++checks;
        switch (kind) {
        case 0: {  // allreduce, float sum
            auto v = take(n, 0.0f);
            for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<float>(oracle::op_kind::sum, q, i + shift);
            chorus::allreduce(g, v, chorus::sum{});
            oracle::compare(f, "allreduce" + where, copy(v), [&](std::size_t i) { return oracle::expected<float>(oracle::op_kind::sum, m, i + shift); });
            break;
        }
        case 1: {  // allreduce, int32 max, n per rank times m
            auto v = take(n * um, std::int32_t{0});
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = oracle::value<std::int32_t>(oracle::op_kind::maximum, q, i + shift);
            chorus::allreduce(g, v, chorus::maximum{});
            oracle::compare(f, "allreduce max" + where, copy(v), [&](std::size_t i) {
                return oracle::expected<std::int32_t>(oracle::op_kind::maximum, m, i + shift);
            });
            break;
        }
        case 2: {  // broadcast from a random root
            rank_t const root = static_cast<rank_t>(gen() % um);
            auto v = take(n, std::int32_t{-1});
            if (q == root)
                for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(i * 7 + shift) + root;
            chorus::broadcast(g, v, root);
            oracle::compare(f, "broadcast from " + std::to_string(root) + where, copy(v),
                            [&](std::size_t i) { return static_cast<std::int32_t>(i * 7 + shift) + root; });
            break;
        }
        case 3: {  // allgather of n / m per rank (at least the size's remainder: 0 included)
            std::size_t const k = n / um;
            auto in = take(k, std::int32_t{0});
            auto out = take(k * um, std::int32_t{-1});
            for (std::size_t j = 0; j < k; ++j) in[j] = static_cast<std::int32_t>(static_cast<std::size_t>(q) * 100003 + j + shift);
            chorus::allgather(g, in, out);
            oracle::compare(f, "allgather" + where, copy(out),
                            [&](std::size_t x) { return static_cast<std::int32_t>(x / (k ? k : 1) * 100003 + x % (k ? k : 1) + shift); });
            break;
        }
        case 4: {  // reduce_scatter, float sum, n per rank
            auto in = take(n * um, 0.0f);
            auto out = take(n, -1.0f);
            for (std::size_t i = 0; i < in.size(); ++i) in[i] = oracle::value<float>(oracle::op_kind::sum, q, i + shift);
            chorus::reduce_scatter(g, in, out, chorus::sum{});
            oracle::compare(f, "reduce_scatter" + where, copy(out), [&](std::size_t j) {
                return oracle::expected<float>(oracle::op_kind::sum, m, static_cast<std::size_t>(q) * n + j + shift);
            });
            break;
        }
        case 6: {  // reduce, int32 sum, to a random root; the others' buffers untouched
            rank_t const root = static_cast<rank_t>(gen() % um);
            auto v = take(n, std::int32_t{0});
            for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<std::int32_t>(oracle::op_kind::sum, q, i + shift);
            chorus::reduce(g, v, chorus::sum{}, root);
            oracle::compare(f, "reduce to " + std::to_string(root) + where, copy(v), [&](std::size_t i) {
                return q == root ? oracle::expected<std::int32_t>(oracle::op_kind::sum, m, i + shift)
                                 : oracle::value<std::int32_t>(oracle::op_kind::sum, q, i + shift);
            });
            break;
        }
        case 7: {  // allreduce of a non-commutative op: the group's rank order (the splits' keys reverse it)
            auto v = take(n, oracle::mat2{});
            for (std::size_t i = 0; i < n; ++i) v[i] = oracle::matrix(q, i + shift);
            chorus::allreduce(g, v, oracle::matmul{});
            oracle::compare(f, "allreduce matmul" + where, copy(v), [&](std::size_t i) { return oracle::matrix_product(m, i + shift); });
            break;
        }
        case 8: {  // allreduce, float avg: divided by the size of the group it runs over
            auto v = take(n, 0.0f);
            for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<float>(oracle::op_kind::avg, q, i + shift);
            chorus::allreduce(g, v, chorus::avg{});
            oracle::compare(f, "allreduce avg" + where, copy(v), [&](std::size_t i) { return oracle::expected<float>(oracle::op_kind::avg, m, i + shift); });
            break;
        }
        default: {  // alltoall, n per peer
            auto send = take(n * um, std::int32_t{0});
            auto recv = take(n * um, std::int32_t{-1});
            for (std::size_t j = 0; j < um; ++j)
                for (std::size_t t = 0; t < n; ++t) send[j * n + t] = static_cast<std::int32_t>(static_cast<std::size_t>(q) * 1000 + j * 7 + t + shift);
            chorus::alltoall(g, send, recv);
            oracle::compare(f, "alltoall" + where, copy(recv), [&](std::size_t x) {
                return static_cast<std::int32_t>(x / n * 1000 + static_cast<std::size_t>(q) * 7 + x % n + shift);
            });
            break;
        }
        }
    };
    // A split's turn: its members call, the others go on (every rank draws alike).
    auto const on_split = [&](auto& g, std::string const& where) {
        std::mt19937 const saved = gen;
        if (g) one(*g, where);
        gen = saved;
        gen.discard(64);  // the members drew at most this many
    };
    if (victim >= 0) {
        std::printf("rank %d: in the mixed loop\n", me);
        std::fflush(stdout);
    }
    for (int it = 0; victim >= 0 || it < iterations; ++it) {
        if (it == 1 && me == victim) signal_self_after(victim, ms, SIGKILL);
        used = 0;
        bool const registered = !shared.empty() && own() % 2 == 0;
        arena = registered ? shared : std::span<std::byte>(heap);
        std::string const at = std::string(registered ? " (registered, iteration " : " (iteration ") + std::to_string(it) + " of seed " + std::to_string(seed) + ", rank " + std::to_string(me);
        switch (gen() % 4) {
        case 0: one(tp, at + ", the group)"); break;
        case 1: on_split(parity, at + ", parity " + std::to_string(me % 2) + ")"); break;
        case 2: on_split(upper, at + ", upper half)"); break;
        default: {  // two nonblocking collectives of the group, a split's blocking one while they run
            std::size_t const n = pick_size(4), k = pick_size(4 * static_cast<std::size_t>(p)) / static_cast<std::size_t>(p);
            auto const shift = static_cast<std::size_t>(gen() % 1000);
            auto v = take(n, 0.0f);
            for (std::size_t i = 0; i < n; ++i) v[i] = oracle::value<float>(oracle::op_kind::sum, me, i + shift);
            auto in = take(k, static_cast<std::int32_t>(me * 7 + static_cast<int>(shift)));
            auto out = take(k * static_cast<std::size_t>(p), std::int32_t{-1});
            auto reduced = chorus::iallreduce(tp, v, chorus::sum{});
            auto gathered = chorus::iallgather(tp, in, out);
            on_split(parity, at + ", parity " + std::to_string(me % 2) + ", while two nonblocking collectives run)");
            gathered.wait();
            reduced.wait();
            checks += 2;
            oracle::compare(f, "iallreduce" + at + ")", copy(v), [&](std::size_t i) { return oracle::expected<float>(oracle::op_kind::sum, p, i + shift); });
            oracle::compare(f, "iallgather" + at + ")", copy(out), [&](std::size_t x) { return static_cast<std::int32_t>(x / k * 7 + shift); });
        }
        }
    }
    if constexpr (std::is_same_v<Tp, chorus::shm_transport>)
        if (reg.kept()) chorus::deregister_buffer(tp, reg);
    chorus::barrier(tp);
    return report(tp, f, checks, "mix");
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
        if (i == 0 && tp.rank() == victim) signal_self_after(victim, ms, sig);
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
    if (mode == "mix") return mix(tp, static_cast<unsigned>(arg(2, 1)), arg(3, 100));
    if (mode == "mix_kill") return mix(tp, static_cast<unsigned>(arg(2, 1)), 0, arg(3, 2), arg(4, 300));
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
