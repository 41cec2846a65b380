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
#include <cstring>
#include <functional>
#include <numeric>
#include <initializer_list>
#include <span>
#include <string>
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
// (void: no reduction): a ring needs a commutative op.
template <class List, class T = void, class Op = void, class F>
void for_each_algo(F&& f) {
    auto const one = [&]<chorus::detail::collective_kind K, class A>() {
        if constexpr (chorus::detail::schedule_applies<K, A, T, Op>) f.template operator()<A>();
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
    for_each_algo<chorus::detail::allreduce_algorithms>(
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
    for_each_algo<chorus::detail::allreduce_algorithms, mat2, matmul>([&]<class Algo>() {
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
    std::size_t const big = up * (2 * chorus::detail::ring_segment_elements<Tp, float>() + 3) + 1;
    std::vector<float> v(big);
    for (std::size_t i = 0; i < big; ++i) v[i] = value<float>(op_kind::sum, tp.rank(), i);
    chorus::allreduce<chorus::ring>(tp, v, chorus::sum{});
    compare(f, label("allreduce", "ring", p, big, "sum float, default segments"), v,
            [&](std::size_t i) { return expected<float>(op_kind::sum, p, i); });

    // Sums that round: every rank must still hold the same bits (each element is reduced
    // once and copied), with segments of every size.
    for (std::size_t segment : {std::size_t{1}, std::size_t{7}, chorus::detail::ring_segment_elements<Tp, float>()}) {
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
    for_each_algo<chorus::detail::reduce_scatter_algorithms>([&]<class Algo>() {
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
    for_each_algo<chorus::detail::reduce_scatter_algorithms, mat2, matmul>([&]<class Algo>() {
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
    for_each_algo<chorus::detail::broadcast_algorithms>([&]<class Algo>() {
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
    for_each_algo<chorus::detail::allgather_algorithms>([&]<class Algo>() {
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
    for_each_algo<chorus::detail::alltoall_algorithms>([&]<class Algo>() {
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

/// alltoallv: skewed counts with zero blocks, packed and with explicit displacements
template <class Tp>
void alltoallv(Tp& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for (std::size_t n : sizes(p)) {
        // Rank i sends count(i, j) elements to rank j: skewed, with zeros.
        auto const count = [&](rank_t i, rank_t j) { return static_cast<std::size_t>((i * 3 + j * 5) % 4) * n; };
        auto const element = [](rank_t i, rank_t j, std::size_t k) {
            return static_cast<double>(i * 1000000 + j * 10000) + static_cast<double>(k);
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
        std::vector<double> recv(want.size(), -1.0);
        chorus::alltoallv(tp, send, sc, recv, rc);
        compare(f, label("alltoallv", "pairwise", p, n, "packed"), recv, [&](std::size_t x) { return want[x]; });

        // Explicit displacements: receive blocks in reverse rank order with a one-element gap
        // between them; the gaps must stay untouched.
        std::vector<int> rd(up), rci(up);
        int offset = 0;
        for (rank_t i = p - 1; i >= 0; --i) {
            rd[static_cast<std::size_t>(i)] = offset;
            rci[static_cast<std::size_t>(i)] = static_cast<int>(count(i, me));
            offset += rci[static_cast<std::size_t>(i)] + 1;
        }
        // Packed send displacements, as long: the exclusive prefix sums of the counts. (Not
        // views::exclusive_scan: g++ 12 warns of a maybe-uninitialised member in it at -O2.)
        std::vector<long> sd(up);
        std::transform_exclusive_scan(sc.begin(), sc.end(), sd.begin(), 0L, std::plus<>{},
                                      [](std::size_t c) { return static_cast<long>(c); });
        std::vector<double> spaced(static_cast<std::size_t>(offset), -7.0);
        chorus::alltoallv(tp, send, sc, sd, spaced, rci, rd);
        std::vector<double> spaced_want(spaced.size(), -7.0);
        for (rank_t i = 0; i < p; ++i)
            for (std::size_t k = 0; k < count(i, me); ++k)
                spaced_want[static_cast<std::size_t>(rd[static_cast<std::size_t>(i)]) + k] = element(i, me, k);
        compare(f, label("alltoallv", "pairwise", p, n, "displacements"), spaced,
                [&](std::size_t x) { return spaced_want[x]; });
    }
}

/// Every check above, in a fixed order (all ranks must run the same sequence).
template <class Tp>
void all(Tp& tp, failures& f) {
    allreduce(tp, f);
    allreduce_noncommutative(tp, f);
    allreduce_user_commutative(tp, f);
    allreduce_pipelined(tp, f);
    reduce(tp, f);
    reduce_scatter(tp, f);
    broadcast(tp, f);
    scatter_gather(tp, f);
    allgather(tp, f);
    alltoall(tp, f);
    alltoallv(tp, f);
}

}  // namespace checks
