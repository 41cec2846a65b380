// SPDX-License-Identifier: MIT
#pragma once

// The collective test matrix: every collective x every algorithm x sizes {0, 1, p-1, p+1, 4099}
// x every op x int/float/double, checked against the closed forms of oracle.hpp; the pipelined
// ring allreduce also with tiny segments, so that small vectors span several segments. Each check
// is a function template over the transport, run by every rank of a group: collectives_test.cpp
// runs them over loopback ranks for p in {1,2,3,4,5,7,8}, tests/process/ over tcp_transport
// in real processes started by chorusrun.

#include "oracle.hpp"

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/for_each.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <initializer_list>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <chorus/chorus.hpp>

namespace checks {

using namespace oracle;
using chorus::rank_t;

inline std::string label(char const* collective, char const* algo, rank_t p, std::size_t n, char const* extra = "") {
    return std::string(collective) + "<" + algo + "> p=" + std::to_string(p) + " n=" + std::to_string(n) + " " + extra;
}

template <class T>
char const* type_name() {
    if constexpr (std::is_same_v<T, int>)
        return "int";
    else if constexpr (std::is_same_v<T, float>)
        return "float";
    else if constexpr (std::is_same_v<T, double>)
        return "double";
    else
        return "T";
}

// Every algorithm in a collective's list (chorus/collectives.hpp), then automatic: an algorithm
// is checked here as soon as it is listed. Only those that apply to elements T reduced with Op
// (void: no reduction): a ring needs a commutative op; and only those that run over the
// transport Tp: one_shot needs a direct_transport.
template <class Tp, class List, class T = void, class Op = void, class F>
void for_each_algo(F&& f) {
    auto const one = [&]<chorus::detail::collective_kind K, class A>() {
        if constexpr (chorus::detail::schedule_applies<K, A, T, Op> && chorus::detail::schedule_serves<A, Tp>) f.template operator()<A>();
    };
    [&]<chorus::detail::collective_kind K, class... A>(chorus::detail::algorithms<K, A...>) {
        (one.template operator()<K, A>(), ...);
    }(List{});
    f.template operator()<chorus::automatic>();
}

template <class Algo>
constexpr char const* algo_name() {
    return Algo::name.data();  // the names are literals: null-terminated
}

// The rank whose data a rooted collective starts from: first, last and middle rank.
inline std::vector<rank_t> roots(rank_t p) {
    return p == 1 ? std::vector<rank_t>{0} : std::vector<rank_t>{0, p - 1, p / 2};
}

template <class T>
T payload(rank_t r, std::size_t i) {
    return static_cast<T>((r * 1000 + static_cast<long long>(i)) % 30011);
}

/// allreduce: every algorithm, op, type and size against the oracle
template <class Tp>
void allreduce(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    for_each_algo<Tp, chorus::detail::allreduce_algorithms>(
        [&]<class Algo>() {
            for_each_type<int, float, double>([&]<class T>() {
                for_each_op<T>([&](op_kind k, auto op) {
                    for (std::size_t n : sizes(p)) {
                        std::vector<T> v(n);
                        for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(k, tp.rank(), i);
                        chorus::allreduce<Algo>(tp, v, op);
                        compare(f, label("allreduce", algo_name<Algo>(), p, n, name(k)) + " " + type_name<T>(), v,
                                [&](std::size_t i) { return expected<T>(k, p, i); });
                    }
                });
            });
        });
}

/// allreduce: a non-commutative op keeps rank order in every order-preserving algorithm
template <class Tp>
void allreduce_noncommutative(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    for_each_algo<Tp, chorus::detail::allreduce_algorithms, mat2, matmul>([&]<class Algo>() {
        for (std::size_t n : sizes(p)) {
            std::vector<mat2> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = matrix(tp.rank(), i);
            chorus::allreduce<Algo>(tp, v, matmul{});
            compare(f, label("allreduce", algo_name<Algo>(), p, n, "matmul"), v,
                    [&](std::size_t i) { return matrix_product(p, i); });
        }
    });
}

/// allreduce: a user lambda marked commutative runs on the ring
template <class Tp>
void allreduce_user_commutative(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    auto const input = [](rank_t r, std::size_t i) {
        return (r % 2 ? -1L : 1L) * ((static_cast<long>(r) * 131 + static_cast<long>(i) * 17) % 97 * 8 + r);
    };
    auto const absmax = chorus::commutative([](long a, long b) { return (a < 0 ? -a : a) < (b < 0 ? -b : b) ? b : a; });
    static_assert(chorus::commutative_reduce_op<decltype(absmax), long>);
    for (std::size_t n : sizes(p)) {
        std::vector<long> v(n);
        // Distinct magnitudes per element, so ties never decide the result.
        for (std::size_t i = 0; i < n; ++i) v[i] = input(tp.rank(), i);
        chorus::allreduce<chorus::ring>(tp, v, absmax);
        compare(f, label("allreduce", "ring", p, n, "absmax"), v, [&](std::size_t i) {
            long best = 0;
            for (rank_t r = 0; r < p; ++r) {
                long const x = input(r, i);
                if (r == 0 || (x < 0 ? -x : x) > (best < 0 ? -best : best)) best = x;
            }
            return best;
        });
    }
}

/// allreduce: the ring's pipeline with tiny segments (detail::ring_allreduce_segmented), so
/// that vectors of a few dozen elements span several segments per block: partial last
/// segments, one element per segment, windows of one chunk, of a few and larger than the
/// whole schedule; then the default segment size on a vector of several segments per block,
/// and bit-identical results on every rank for float sums that round.
template <class Tp>
void allreduce_pipelined(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    auto const up = static_cast<std::size_t>(p);
    struct pipeline {
        std::size_t segment, window;
    };
    auto const run = [&](pipeline pl, std::initializer_list<std::size_t> ns) {
        std::string const extra = "segment=" + std::to_string(pl.segment) + " window=" + std::to_string(pl.window) + " ";
        for_each_type<int, float, double>([&]<class T>() {
            for_each_op<T>([&](op_kind k, auto op) {
                for (std::size_t n : ns) {
                    std::vector<T> v(n);
                    for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(k, tp.rank(), i);
                    chorus::detail::ring_allreduce_segmented(tp, std::span<T>(v), op, pl.segment, pl.window);
                    compare(f, label("allreduce", "ring", p, n, (extra + name(k) + " " + type_name<T>()).c_str()), v,
                            [&](std::size_t i) { return expected<T>(k, p, i); });
                }
            });
        });
    };
    for (pipeline pl : {pipeline{1, 1}, pipeline{3, 2}, pipeline{5, 4}, pipeline{2, 64}}) {
        std::size_t const s = pl.segment;
        // Largest block 3 segments + 1 element; blocks of 3 segments + 2 and + 3 elements.
        run(pl, {0, up - 1, up * 3 * s + up - 1, up * (3 * s + 2) + 1});
    }
    run({64, 4}, {4099});

    // The default segment size: blocks of two segments and a few elements.
    std::size_t const big = up * (2 * chorus::detail::ring_segment_elements<float>(tp) + 3) + 1;
    std::vector<float> v(big);
    for (std::size_t i = 0; i < big; ++i) v[i] = value<float>(op_kind::sum, tp.rank(), i);
    chorus::allreduce<chorus::ring>(tp, v, chorus::sum{});
    compare(f, label("allreduce", "ring", p, big, "sum float, default segments"), v,
            [&](std::size_t i) { return expected<float>(op_kind::sum, p, i); });

    // Sums that round: every rank must still hold the same bits (each element is reduced
    // once and copied), with segments of every size.
    for (std::size_t segment : {std::size_t{1}, std::size_t{7}, chorus::detail::ring_segment_elements<float>(tp)}) {
        std::size_t const n = up * 40 + 3;
        std::vector<float> mine(n);
        for (std::size_t i = 0; i < n; ++i)
            mine[i] = 0.1f * static_cast<float>(tp.rank() + 1) + 1e-3f * static_cast<float>(i) + 1e-7f;
        chorus::detail::ring_allreduce_segmented(tp, std::span<float>(mine), chorus::sum{}, segment, 3);
        std::vector<float> first = mine;
        chorus::broadcast<chorus::tree>(tp, first, 0);
        bool const same = std::memcmp(first.data(), mine.data(), n * sizeof(float)) == 0;
        if (!same)
            f.add(label("allreduce", "ring", p, n, "segment=") + std::to_string(segment) + ": rank " +
                  std::to_string(tp.rank()) + "'s rounded sums differ from rank 0's bits");
    }
}

/// reduce: every root, op, type and size; in place and into a separate buffer
template <class Tp>
void reduce(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    for_each_type<int, float, double>([&]<class T>() {
        for_each_op<T>([&](op_kind k, auto op) {
            for (rank_t root : roots(p))
                for (std::size_t n : sizes(p)) {
                    std::vector<T> send(n), recv(me == root ? n : 0);
                    for (std::size_t i = 0; i < n; ++i) send[i] = value<T>(k, me, i);
                    std::vector<T> const original = send;
                    chorus::reduce<chorus::tree>(tp, send, recv, op, root);
                    std::string const what = label("reduce", "tree", p, n, name(k)) + " root=" + std::to_string(root);
                    if (me == root) compare(f, what, recv, [&](std::size_t i) { return expected<T>(k, p, i); });
                    compare(f, what + " (send untouched)", send, [&](std::size_t i) { return original[i]; });
                    chorus::reduce(tp, send, op, root);  // in place, automatic
                    if (me == root)
                        compare(f, what + " in place", send, [&](std::size_t i) { return expected<T>(k, p, i); });
                    else
                        compare(f, what + " in place (non-root untouched)", send,
                                [&](std::size_t i) { return original[i]; });
                }
        });
    });
    for (rank_t root : roots(p))
        for (std::size_t n : sizes(p)) {
            std::vector<mat2> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = matrix(me, i);
            chorus::reduce(tp, v, matmul{}, root);
            if (me == root)
                compare(f, label("reduce", "tree", p, n, "matmul") + " root=" + std::to_string(root), v,
                        [&](std::size_t i) { return matrix_product(p, i); });
        }
}

/// reduce_scatter: ring and tree, every op, type and size
template <class Tp>
void reduce_scatter(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for_each_algo<Tp, chorus::detail::reduce_scatter_algorithms>([&]<class Algo>() {
        for_each_type<int, float, double>([&]<class T>() {
            for_each_op<T>([&](op_kind k, auto op) {
                for (std::size_t n : sizes(p)) {
                    std::vector<T> send(up * n), recv(n);
                    for (std::size_t i = 0; i < up * n; ++i) send[i] = value<T>(k, me, i);
                    chorus::reduce_scatter<Algo>(tp, send, recv, op);
                    compare(f, label("reduce_scatter", algo_name<Algo>(), p, n, name(k)) + " " + type_name<T>(), recv,
                            [&](std::size_t i) { return expected<T>(k, p, static_cast<std::size_t>(me) * n + i); });
                }
            });
        });
    });
    for_each_algo<Tp, chorus::detail::reduce_scatter_algorithms, mat2, matmul>([&]<class Algo>() {
        for (std::size_t n : sizes(p)) {
            std::vector<mat2> send(up * n), recv(n);
            for (std::size_t i = 0; i < up * n; ++i) send[i] = matrix(me, i);
            chorus::reduce_scatter<Algo>(tp, send, recv, matmul{});
            compare(f, label("reduce_scatter", algo_name<Algo>(), p, n, "matmul"), recv,
                    [&](std::size_t i) { return matrix_product(p, static_cast<std::size_t>(me) * n + i); });
        }
    });
}

/// broadcast: tree, linear and scatter_allgather, every root, type and size
template <class Tp>
void broadcast(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    for_each_algo<Tp, chorus::detail::broadcast_algorithms>([&]<class Algo>() {
        for_each_type<int, float, double>([&]<class T>() {
            for (rank_t root : roots(p))
                for (std::size_t n : sizes(p)) {
                    std::vector<T> v(n, T{-1});
                    if (tp.rank() == root)
                        for (std::size_t i = 0; i < n; ++i) v[i] = payload<T>(root, i);
                    chorus::broadcast<Algo>(tp, v, root);
                    compare(
                        f,
                        label("broadcast", algo_name<Algo>(), p, n, type_name<T>()) + " root=" + std::to_string(root),
                        v, [&](std::size_t i) { return payload<T>(root, i); });
                }
        });
    });
    // Above the automatic threshold (scatter_allgather from p = 5 on): an odd size, so the
    // blocks differ in length.
    for (rank_t root : roots(p)) {
        std::size_t const n = chorus::detail::broadcast_large_bytes / sizeof(int) + 2 * static_cast<std::size_t>(p) + 1;
        std::vector<int> v(n, -1);
        if (tp.rank() == root)
            for (std::size_t i = 0; i < n; ++i) v[i] = payload<int>(root, i);
        chorus::broadcast(tp, v, root);
        compare(f, label("broadcast", "automatic", p, n, "int large") + " root=" + std::to_string(root), v,
                [&](std::size_t i) { return payload<int>(root, i); });
    }
    // A user-supplied tree: the binary tree rooted at the last rank.
    std::vector<int> v(5, tp.rank() == p - 1 ? 42 : 0);
    chorus::tree_broadcast(tp, chorus::binary_tree(p, p - 1), std::span<int>(v));
    compare(f, "tree_broadcast over binary_tree", v, [](std::size_t) { return 42; });
}

/// scatter and gather: every root, type and size
template <class Tp>
void scatter_gather(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for_each_type<int, float, double>([&]<class T>() {
        for (rank_t root : roots(p))
            for (std::size_t n : sizes(p)) {
                std::vector<T> all(me == root ? up * n : 0), mine(n, T{-1});
                for (std::size_t i = 0; i < all.size(); ++i) all[i] = payload<T>(static_cast<rank_t>(i / n), i % n);
                chorus::scatter(tp, all, mine, root);
                std::string const where = std::string(type_name<T>()) + " root=" + std::to_string(root);
                compare(f, label("scatter", "linear", p, n, where.c_str()), mine,
                        [&](std::size_t i) { return payload<T>(me, i); });
                std::vector<T> gathered(me == root ? up * n : 0, T{-1});
                chorus::gather<chorus::linear>(tp, mine, gathered, root);
                compare(f, label("gather", "linear", p, n, where.c_str()), gathered,
                        [&](std::size_t i) { return payload<T>(static_cast<rank_t>(i / n), i % n); });
            }
    });
}

/// allgather: ring, bruck and automatic, every type and size
template <class Tp>
void allgather(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    auto const up = static_cast<std::size_t>(p);
    for_each_algo<Tp, chorus::detail::allgather_algorithms>([&]<class Algo>() {
        for_each_type<int, float, double>([&]<class T>() {
            for (std::size_t n : sizes(p)) {
                std::vector<T> mine(n), all(up * n, T{-1});
                for (std::size_t i = 0; i < n; ++i) mine[i] = payload<T>(tp.rank(), i);
                chorus::allgather<Algo>(tp, mine, all);
                compare(f, label("allgather", algo_name<Algo>(), p, n, type_name<T>()), all,
                        [&](std::size_t i) { return payload<T>(static_cast<rank_t>(i / n), i % n); });
            }
        });
    });
}

/// alltoall: the transpose, pairwise, bruck and automatic, every type and size
template <class Tp>
void alltoall(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    // Element k of the block rank i sends to rank j.
    auto const block_value = [](rank_t i, rank_t j, std::size_t k) {
        return (i * 100 + j) * 10000 + static_cast<long long>(k);
    };
    for_each_algo<Tp, chorus::detail::alltoall_algorithms>([&]<class Algo>() {
        for_each_type<int, float, double>([&]<class T>() {
            for (std::size_t n : sizes(p)) {
                std::vector<T> send(up * n), recv(up * n, T{-1});
                for (std::size_t x = 0; x < up * n; ++x)
                    send[x] = static_cast<T>(block_value(me, static_cast<rank_t>(x / n), x % n) % 30011);
                chorus::alltoall<Algo>(tp, send, recv);
                compare(f, label("alltoall", algo_name<Algo>(), p, n, type_name<T>()), recv, [&](std::size_t x) {
                    return static_cast<T>(block_value(static_cast<rank_t>(x / n), me, x % n) % 30011);
                });
            }
        });
    });
}

/// alltoallv: skewed counts with zero blocks, packed and with explicit displacements, every
/// algorithm (zero_copy where the transport exposes), ints and doubles
template <class Tp>
void alltoallv(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for_each_algo<Tp, chorus::detail::alltoallv_algorithms>([&]<class Algo>() {
        for_each_type<int, double>([&]<class T>() {
            for (std::size_t n : sizes(p)) {
                // Rank i sends count(i, j) elements to rank j: skewed, with zeros.
                auto const count = [&](rank_t i, rank_t j) { return static_cast<std::size_t>((i * 3 + j * 5) % 4) * n; };
                auto const element = [](rank_t i, rank_t j, std::size_t k) {
                    return static_cast<T>(i * 1000000 + j * 10000 + static_cast<long long>(k));
                };
                namespace views = ranges::views;
                auto const ranks = views::iota(rank_t{0}, p);
                // This rank's block for rank j, and rank i's block for this rank, in rank order.
                auto const block = [&](rank_t from, rank_t to) {
                    return views::iota(std::size_t{0}, count(from, to)) |
                           views::transform([=](std::size_t k) { return element(from, to, k); });
                };
                auto const sc = ranks | views::transform([&](rank_t j) { return count(me, j); }) | ranges::to<std::vector>();
                auto const rc = ranks | views::transform([&](rank_t i) { return count(i, me); }) | ranges::to<std::vector>();
                auto const send = ranks | views::for_each([&](rank_t j) { return block(me, j); }) | ranges::to<std::vector>();
                auto const want = ranks | views::for_each([&](rank_t i) { return block(i, me); }) | ranges::to<std::vector>();
                std::vector<T> recv(want.size(), T(-1));
                chorus::alltoallv<Algo>(tp, send, sc, recv, rc);
                compare(f, label("alltoallv", algo_name<Algo>(), p, n, type_name<T>()) + " packed", recv,
                        [&](std::size_t x) { return want[x]; });

                // Explicit displacements: receive blocks in reverse rank order with a one-element
                // gap between them; the gaps must stay untouched.
                std::vector<int> rd(up), rci(up);
                int offset = 0;
                for (rank_t i = p - 1; i >= 0; --i) {
                    rd[static_cast<std::size_t>(i)] = offset;
                    rci[static_cast<std::size_t>(i)] = static_cast<int>(count(i, me));
                    offset += rci[static_cast<std::size_t>(i)] + 1;
                }
                // Packed send displacements, as long: the exclusive prefix sums of the counts.
                // (Not views::exclusive_scan: g++ 12 warns of a maybe-uninitialised member in it
                // at -O2.)
                std::vector<long> sd(up);
                std::transform_exclusive_scan(sc.begin(), sc.end(), sd.begin(), 0L, std::plus<>{},
                                              [](std::size_t c) { return static_cast<long>(c); });
                std::vector<T> spaced(static_cast<std::size_t>(offset), T(-7));
                chorus::alltoallv<Algo>(tp, send, sc, sd, spaced, rci, rd);
                std::vector<T> spaced_want(spaced.size(), T(-7));
                for (rank_t i = 0; i < p; ++i)
                    for (std::size_t k = 0; k < count(i, me); ++k)
                        spaced_want[static_cast<std::size_t>(rd[static_cast<std::size_t>(i)]) + k] = element(i, me, k);
                compare(f, label("alltoallv", algo_name<Algo>(), p, n, type_name<T>()) + " displacements", spaced,
                        [&](std::size_t x) { return spaced_want[x]; });
            }
        });
    });
}

// Skewed per-rank counts with zeros: rank r's count for size n (the v-collectives).
inline std::vector<int> skewed_counts(rank_t p, std::size_t n) {
    std::vector<int> c(static_cast<std::size_t>(p));
    for (rank_t r = 0; r < p; ++r) c[static_cast<std::size_t>(r)] = static_cast<int>(static_cast<std::size_t>((r * 5 + 2) % 4) * n);
    return c;
}

inline std::size_t offset_of(std::vector<int> const& counts, rank_t r) {
    return static_cast<std::size_t>(std::accumulate(counts.begin(), counts.begin() + r, 0));
}

/// gatherv, scatterv, allgatherv: skewed counts with zero blocks, every root, int and double
template <class Tp>
void gather_scatter_v(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    for_each_type<int, double>([&]<class T>() {
        for (std::size_t n : sizes(p)) {
            auto const counts = skewed_counts(p, n);
            auto const total = offset_of(counts, p);
            auto const mine = static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]);
            // Element x of the packed vector belongs to the rank whose block holds it.
            auto const owner = [&](std::size_t x) {
                rank_t r = 0;
                while (offset_of(counts, r + 1) <= x) ++r;
                return r;
            };
            auto const element = [&](std::size_t x) { return payload<T>(owner(x), x - offset_of(counts, owner(x))); };
            std::vector<T> own(mine);
            for (std::size_t i = 0; i < mine; ++i) own[i] = payload<T>(me, i);
            for (rank_t root : roots(p)) {
                std::string const where = std::string(type_name<T>()) + " root=" + std::to_string(root);
                std::vector<T> gathered(me == root ? total : 0, T{-1});
                chorus::gatherv(tp, own, gathered, me == root ? counts : std::vector<int>{}, root);
                compare(f, label("gatherv", "linear", p, n, where.c_str()), gathered, element);
                std::vector<T> back(mine, T{-1});
                chorus::scatterv(tp, gathered, me == root ? counts : std::vector<int>{}, back, root);
                compare(f, label("scatterv", "linear", p, n, where.c_str()), back,
                        [&](std::size_t i) { return payload<T>(me, i); });
            }
            std::vector<T> all(total, T{-1});
            chorus::allgatherv(tp, own, all, counts);
            compare(f, label("allgatherv", "ring", p, n, type_name<T>()), all, element);
        }
    });
}

/// reduce_scatter with per-rank counts: ring, tree and automatic, every op and type, skewed
/// counts; the non-commutative matrix product keeps rank order (tree, automatic)
template <class Tp>
void reduce_scatter_v(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    for_each_algo<Tp, chorus::detail::reduce_scatterv_algorithms>([&]<class Algo>() {
        for_each_type<int, float, double>([&]<class T>() {
            for_each_op<T>([&](op_kind k, auto op) {
                for (std::size_t n : sizes(p)) {
                    auto const counts = skewed_counts(p, n);
                    std::vector<T> send(offset_of(counts, p));
                    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<T>(k, me, i);
                    std::vector<T> recv(static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]), T{-1});
                    chorus::reduce_scatter<Algo>(tp, send, recv, counts, op);
                    std::size_t const at = offset_of(counts, me);
                    compare(f, label("reduce_scatter(counts)", algo_name<Algo>(), p, n, name(k)) + " " + type_name<T>(),
                            recv, [&](std::size_t i) { return expected<T>(k, p, at + i); });
                }
            });
        });
    });
    for_each_algo<Tp, chorus::detail::reduce_scatterv_algorithms, mat2, matmul>([&]<class Algo>() {
        for (std::size_t n : sizes(p)) {
            auto const counts = skewed_counts(p, n);
            std::vector<mat2> send(offset_of(counts, p));
            for (std::size_t i = 0; i < send.size(); ++i) send[i] = matrix(me, i);
            std::vector<mat2> recv(static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]));
            chorus::reduce_scatter<Algo>(tp, send, recv, counts, matmul{});
            std::size_t const at = offset_of(counts, me);
            compare(f, label("reduce_scatter(counts)", algo_name<Algo>(), p, n, "matmul"), recv,
                    [&](std::size_t i) { return matrix_product(p, at + i); });
        }
    });
}

/// allgather and alltoall in place (MPI_IN_PLACE), every algorithm
template <class Tp>
void in_place(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for (std::size_t n : sizes(p)) {
        for_each_algo<Tp, chorus::detail::allgather_algorithms>([&]<class Algo>() {
            std::vector<double> all(up * n, -1.0);
            for (std::size_t i = 0; i < n; ++i) all[static_cast<std::size_t>(me) * n + i] = payload<double>(me, i);
            chorus::allgather<Algo>(tp, all);
            compare(f, label("allgather", algo_name<Algo>(), p, n, "in place"), all,
                    [&](std::size_t x) { return payload<double>(static_cast<rank_t>(x / n), x % n); });
        });
        for_each_algo<Tp, chorus::detail::alltoall_algorithms>([&]<class Algo>() {
            std::vector<int> data(up * n);
            for (std::size_t x = 0; x < up * n; ++x) data[x] = me * 100000 + static_cast<int>(x);
            chorus::alltoall<Algo>(tp, data);
            compare(f, label("alltoall", algo_name<Algo>(), p, n, "in place"), data, [&](std::size_t x) {
                auto const from = static_cast<rank_t>(x / n);
                return from * 100000 + static_cast<int>(static_cast<std::size_t>(me) * n + x % n);
            });
        });
    }
}

/// scan and exscan: every op, type and size, separate buffers and in place; the matrix
/// product keeps rank order
template <class Tp>
void scans(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    for_each_type<int, float, double>([&]<class T>() {
        for_each_op<T>([&](op_kind k, auto op) {
            for (std::size_t n : sizes(p)) {
                std::vector<T> send(n), recv(n, T{-1});
                for (std::size_t i = 0; i < n; ++i) send[i] = value<T>(k, me, i);
                std::string const what = std::string(name(k)) + " " + type_name<T>();
                chorus::scan(tp, send, recv, op);
                compare(f, label("scan", "recursive_doubling", p, n, what.c_str()), recv,
                        [&](std::size_t i) { return expected<T>(k, me + 1, i); });
                std::vector<T> ex(n, T{-3});
                chorus::exscan<chorus::recursive_doubling>(tp, send, ex, op);
                compare(f, label("exscan", "recursive_doubling", p, n, what.c_str()), ex,
                        [&](std::size_t i) { return me == 0 ? T{-3} : expected<T>(k, me, i); });
                chorus::scan(tp, send, op);  // in place
                compare(f, label("scan", "recursive_doubling", p, n, (what + " in place").c_str()), send,
                        [&](std::size_t i) { return expected<T>(k, me + 1, i); });
            }
        });
    });
    for (std::size_t n : sizes(p)) {
        std::vector<mat2> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = matrix(me, i);
        std::vector<mat2> ex = v;
        chorus::exscan(tp, ex, matmul{});
        compare(f, label("exscan", "recursive_doubling", p, n, "matmul in place"), ex,
                [&](std::size_t i) { return me == 0 ? matrix(0, i) : matrix_product(me, i); });
        chorus::scan(tp, v, matmul{});
        compare(f, label("scan", "recursive_doubling", p, n, "matmul in place"), v,
                [&](std::size_t i) { return matrix_product(me + 1, i); });
    }
}

template <class Tp>
void one_shot_collectives(Tp& tp, failures& f);

/// Sub-groups: a rows x columns grid (split), the even ranks (group), a group of a group; the
/// collectives of a row and a column in flight at once; point-to-point inside a group
template <class Tp>
void groups(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    rank_t const width = p >= 4 ? 2 : 1;  // rows of `width` ranks; the last row may be short
    auto row = chorus::split(tp, me / width, me);
    auto column = chorus::split(tp, me % width, -me);  // keys reversed: the last rank is group rank 0
    std::string const where = "p=" + std::to_string(p) + " rank " + std::to_string(me);
    if (!row || !column) {
        f.add("split: " + where + " is in no group");
        return;
    }
    rank_t const row_first = me / width * width, row_size = std::min(width, p - row_first);
    rank_t const columns = (p - 1 - me % width) / width + 1;  // ranks of this column
    if (row->rank() != me - row_first || row->size() != row_size || column->size() != columns ||
        column->rank() != columns - 1 - me / width)
        f.add("split: " + where + " has row rank " + std::to_string(row->rank()) + " of " + std::to_string(row->size()) +
              ", column rank " + std::to_string(column->rank()) + " of " + std::to_string(column->size()));
    // A group's ring cuts the segments its parent asks for, for the group's ranks where that
    // depends on them (node_transport), else for its own (tcp_transport's 1 MiB, not 256 KiB).
    for (auto const* g : {&*row, &*column}) {
        std::size_t want = chorus::detail::ring_segment_bytes_of(tp);
        if constexpr (requires { tp.ring_segment_bytes(g->members()); }) want = tp.ring_segment_bytes(g->members());
        if (std::size_t const got = chorus::detail::ring_segment_bytes_of(*g); got != want)
            f.add("split: " + where + ": a group's ring segment is " + std::to_string(got) + " bytes, its parent asks for " +
                  std::to_string(want));
    }
    // Where the parent gives its groups direct exchanges (shm_transport; node_transport for a
    // group inside one node), every collective one_shot serves, over a row and over a column;
    // then rounds of a row, the parent and a column in turn, a row taking one more than the
    // others every other time: each set of ranks keeps its own rounds in slots of its own.
    if constexpr (chorus::direct_transport<std::remove_cvref_t<decltype(*row)>>) {
        for (auto* g : {&*row, &*column}) {
            bool want = true;
            if constexpr (requires { tp.hierarchy(); })
                want = std::ranges::all_of(g->members(), [&](rank_t r) { return tp.hierarchy().node_of(r) == tp.node(); });
            if ((g->direct_bytes() != 0) != want)
                f.add("split: " + where + ": a group of " + std::to_string(g->size()) + " has " + std::to_string(g->direct_bytes()) +
                      " direct bytes" + (want ? ", none" : " across nodes"));
            if (g->direct_bytes() != 0) one_shot_collectives(*g, f);  // the same on every rank of g
        }
        for (int k = 0; k < 4; ++k) {
            std::string const at = where + " turn " + std::to_string(k);
            std::vector<long> in_all(3, me * k), in_column(2, me == column->parent_rank(0) ? k + 100 : -1);
            if (row->direct_bytes() != 0) {
                long row_sum = 0;
                for (rank_t r : row->members()) row_sum += r + k;
                for (int twice = 0; twice <= k % 2; ++twice) {
                    std::vector<long> in_row(5, me + k);
                    chorus::allreduce<chorus::one_shot>(*row, in_row);
                    compare(f, "one_shot allreduce over a row between the parent's rounds, " + at, in_row, [&](std::size_t) { return row_sum; });
                }
            }
            if constexpr (chorus::direct_transport<Tp>) chorus::allreduce<chorus::one_shot>(tp, in_all);
            else chorus::allreduce(tp, in_all);
            compare(f, "allreduce over the parent between the groups' rounds, " + at, in_all,
                    [&](std::size_t) { return static_cast<long>(p) * (p - 1) / 2 * k; });
            if (column->direct_bytes() != 0) {
                chorus::broadcast<chorus::one_shot>(*column, in_column, 0);
                compare(f, "one_shot broadcast over a column between the parent's rounds, " + at, in_column,
                        [&](std::size_t) { return static_cast<long>(k + 100); });
            }
        }
    }
    // Sums over the row and over the column, both in flight at once, waited in reverse.
    for (std::size_t n : sizes(p)) {
        std::vector<long> by_row(n), by_column(n);
        for (std::size_t i = 0; i < n; ++i) by_row[i] = by_column[i] = me * 1000 + static_cast<long>(i);
        auto a = chorus::iallreduce(*row, by_row);
        auto b = chorus::iallreduce(*column, by_column);
        b.wait();
        a.wait();
        auto const sum_of = [&](auto& g, std::size_t i) {
            long s = 0;
            for (rank_t r : g.members()) s += r * 1000 + static_cast<long>(i);
            return s;
        };
        compare(f, "iallreduce over a row, " + where + " n=" + std::to_string(n), by_row,
                [&](std::size_t i) { return sum_of(*row, i); });
        compare(f, "iallreduce over a column, " + where + " n=" + std::to_string(n), by_column,
                [&](std::size_t i) { return sum_of(*column, i); });
        // A scan down the column: in group rank order, the reversed parent order.
        std::vector<long> prefix(n, me);
        chorus::scan(*column, prefix);
        compare(f, "scan over a column, " + where, prefix, [&](std::size_t) {
            long s = 0;
            for (rank_t r = 0; r <= column->rank(); ++r) s += column->parent_rank(r);
            return s;
        });
    }
    // Two groups of the same ranks, collectives started in opposite orders on even and odd
    // ranks (legal: only each group's own order must agree): their tags must keep them apart.
    auto twin_a = chorus::split(tp, 0), twin_b = chorus::split(tp, 0);
    for (std::size_t n : {std::size_t{3}, std::size_t{1000}}) {
        std::vector<int> a(n, me), b(n + 1, 2 * me);
        chorus::collective_request ra, rb;
        if (me % 2 == 0) {
            ra = chorus::iallreduce(*twin_a, a);
            rb = chorus::iallreduce(*twin_b, b);
        } else {
            rb = chorus::iallreduce(*twin_b, b);
            ra = chorus::iallreduce(*twin_a, a);
        }
        ra.wait();
        rb.wait();
        compare(f, "two groups of the same ranks, opposite orders, group a, " + where, a,
                [&](std::size_t) { return p * (p - 1) / 2; });
        compare(f, "two groups of the same ranks, opposite orders, group b, " + where, b,
                [&](std::size_t) { return p * (p - 1); });
    }
    // The even ranks, in descending order; the odd ranks get no group.
    std::vector<int> evens;
    for (rank_t r = (p - 1) / 2 * 2; r >= 0; r -= 2) evens.push_back(r);
    auto even = chorus::group(tp, evens);
    if (even.has_value() != (me % 2 == 0)) f.add("group: " + where + " membership is wrong");
    if (even) {
        std::vector<int> v(3, me % 2 == 0 && even->rank() == 0 ? 77 : 0);
        chorus::broadcast(*even, v, 0);
        compare(f, "broadcast over the even ranks, " + where, v, [](std::size_t) { return 77; });
        // A group of the group: its first two ranks (the two highest even ranks).
        auto pair = chorus::split(*even, even->rank() < 2 ? 0 : chorus::undefined_color);
        if (pair) {
            int token = me, other = -1;
            rank_t const peer = 1 - pair->rank();
            if (pair->size() == 2) {
                chorus::sendrecv(*pair, peer, std::span<int const>(&token, 1), peer, std::span<int>(&other, 1), 12345);
                if (other != pair->parent_rank(peer)) f.add("sendrecv in a group of a group, " + where);
            }
        }
    }
    // A rank outside a split gets nothing, and the others still agree.
    auto none = chorus::split(tp, me == 0 ? chorus::undefined_color : 1);
    if (none.has_value() == (me == 0)) f.add("split with undefined_color: " + where);
    if (none) {
        std::vector<int> one{1};
        chorus::allreduce(*none, one);
        if (one[0] != p - 1) f.add("allreduce without rank 0, " + where + ": " + std::to_string(one[0]));
    }
}

/// Nonblocking collectives: several in flight, waited in another order than started, with a
/// blocking collective and test() polling between
template <class Tp>
void nonblocking(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    // The ring of an i-collective cuts the transport's segments, as the blocking form does.
    if (chorus::detail::nonblocking_view<Tp> const view(tp, 0, nullptr, std::chrono::milliseconds(1));
        chorus::detail::ring_segment_bytes_of(view) != chorus::detail::ring_segment_bytes_of(tp))
        f.add("nonblocking: the view's ring segment is " + std::to_string(chorus::detail::ring_segment_bytes_of(view)) +
              " bytes, the transport's " + std::to_string(chorus::detail::ring_segment_bytes_of(tp)));
    for (std::size_t n : sizes(p)) {
        std::string const where = "p=" + std::to_string(p) + " n=" + std::to_string(n);
        std::vector<double> sum(n), max(n);
        for (std::size_t i = 0; i < n; ++i) {
            sum[i] = value<double>(op_kind::sum, me, i);
            max[i] = value<double>(op_kind::maximum, me, i);
        }
        std::vector<int> bcast(n, me == p - 1 ? 5 : 0), mine(n, me), gathered(up * n, -1), scattered(n, -1),
            contributions(up * n, me), transposed(up * n, -1), sent(up * n);
        for (std::size_t x = 0; x < up * n; ++x) sent[x] = me * 1000 + static_cast<int>(x / std::max<std::size_t>(n, 1));
        std::vector<int> counts(up, static_cast<int>(n)), vsent = sent, vrecv(up * n, -1);
        std::vector<chorus::collective_request> requests;
        requests.push_back(chorus::iallreduce(tp, sum));
        requests.push_back(chorus::iallreduce(tp, max, chorus::maximum{}));
        requests.push_back(chorus::ibroadcast(tp, bcast, p - 1));
        requests.push_back(chorus::iallgather(tp, mine, gathered));
        requests.push_back(chorus::ireduce_scatter(tp, contributions, scattered));
        requests.push_back(chorus::ialltoall(tp, sent, transposed));
        requests.push_back(chorus::ialltoallv(tp, vsent, counts, vrecv, counts));
        requests.push_back(chorus::ibarrier(tp));
        std::vector<int> blocking(2, 1);
        chorus::allreduce(tp, blocking);  // a blocking collective while they are in flight
        if (blocking[0] != p) f.add("blocking allreduce among nonblocking ones, " + where);
        while (!requests[3].test()) chorus::progress();
        for (auto it = requests.rbegin(); it != requests.rend(); ++it) it->wait();
        compare(f, "iallreduce sum " + where, sum, [&](std::size_t i) { return expected<double>(op_kind::sum, p, i); });
        compare(f, "iallreduce max " + where, max, [&](std::size_t i) { return expected<double>(op_kind::maximum, p, i); });
        compare(f, "ibroadcast " + where, bcast, [](std::size_t) { return 5; });
        compare(f, "iallgather " + where, gathered, [&](std::size_t x) { return static_cast<int>(x / n); });
        compare(f, "ireduce_scatter " + where, scattered, [&](std::size_t) { return p * (p - 1) / 2; });
        auto const from = [&](std::size_t x) { return static_cast<int>(x / n) * 1000 + me; };
        compare(f, "ialltoall " + where, transposed, from);
        compare(f, "ialltoallv " + where, vrecv, from);
    }
}

/// barrier, every algorithm: no rank leaves before the last one arrived (it arrives 300 ms
/// after leaving an allreduce with the others; a rank that leaves before 50 ms fails, a margin
/// for ranks of a loaded machine that leave the allreduce late)
template <class Tp>
void barrier(Tp& tp, failures& f) {
    for_each_algo<Tp, chorus::detail::barrier_algorithms>([&]<class Algo>() {
        std::vector<int> one{1};
        chorus::allreduce(tp, one);  // everyone arrived: the ranks leave it at about the same time
        auto const left = std::chrono::steady_clock::now();
        if (tp.rank() == tp.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        chorus::barrier<Algo>(tp);
        auto const waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - left);
        if (tp.size() > 1 && waited < std::chrono::milliseconds(50))
            f.add(label("barrier", algo_name<Algo>(), tp.size(), 0) + "rank " + std::to_string(tp.rank()) + " left after " +
                  std::to_string(waited.count()) + " ms, before the last rank arrived");
    });
}

/// The collectives one_shot serves, every algorithm of each (one_shot among them over a
/// direct_transport), in and out of place.
template <class Tp>
void one_shot_collectives(Tp& tp, failures& f) {
    barrier(tp, f);
    allreduce(tp, f);
    allreduce_noncommutative(tp, f);
    reduce_scatter(tp, f);
    broadcast(tp, f);
    allgather(tp, f);
    alltoall(tp, f);
    in_place(tp, f);
}

/// The checks of reductions (every op, type and algorithm of each), in a fixed order (all
/// ranks must run the same sequence): two thirds of the matrix's time.
template <class Tp>
void reductions(Tp& tp, failures& f) {
    allreduce(tp, f);
    allreduce_noncommutative(tp, f);
    allreduce_user_commutative(tp, f);
    allreduce_pipelined(tp, f);
    reduce(tp, f);
    reduce_scatter(tp, f);
    reduce_scatter_v(tp, f);
    scans(tp, f);
}

/// The checks of everything but reductions, in a fixed order.
template <class Tp>
void movement(Tp& tp, failures& f) {
    barrier(tp, f);
    broadcast(tp, f);
    scatter_gather(tp, f);
    allgather(tp, f);
    alltoall(tp, f);
    alltoallv(tp, f);
    gather_scatter_v(tp, f);
    in_place(tp, f);
    groups(tp, f);
    nonblocking(tp, f);
}

/// Every check above.
template <class Tp>
void all(Tp& tp, failures& f) {
    movement(tp, f);
    reductions(tp, f);
}

}  // namespace checks
