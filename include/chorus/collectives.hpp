// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The front doors: one function per collective of the seed, over any transport and any
// contiguous range. The algorithm is a template argument, `allreduce<ring>(tp, v, op)`, or
// chosen at run time when none is given (detail/select.hpp; CHORUS_ALGO overrides it,
// CHORUS_DEBUG logs it). Each algorithm lives in its own header under algorithm/, which
// registers its schedule (detail/schedule.hpp); each collective's algorithms are listed once,
// below. A new algorithm: its header, its #include here, its tag in its collective's list.

#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

#include <chorus/algorithm/bruck_allgather.hpp>
#include <chorus/algorithm/bruck_alltoall.hpp>
#include <chorus/algorithm/dissemination_barrier.hpp>
#include <chorus/algorithm/linear_broadcast.hpp>
#include <chorus/algorithm/linear_gather.hpp>
#include <chorus/algorithm/linear_gatherv.hpp>
#include <chorus/algorithm/linear_scatter.hpp>
#include <chorus/algorithm/linear_scatterv.hpp>
#include <chorus/algorithm/pairwise_alltoall.hpp>
#include <chorus/algorithm/pairwise_alltoallv.hpp>
#include <chorus/algorithm/one_shot_allgather.hpp>
#include <chorus/algorithm/one_shot_allreduce.hpp>
#include <chorus/algorithm/one_shot_alltoall.hpp>
#include <chorus/algorithm/one_shot_barrier.hpp>
#include <chorus/algorithm/one_shot_broadcast.hpp>
#include <chorus/algorithm/one_shot_reduce_scatter.hpp>
#include <chorus/algorithm/rabenseifner_allreduce.hpp>
#include <chorus/algorithm/recursive_doubling_allreduce.hpp>
#include <chorus/algorithm/recursive_doubling_scan.hpp>
#include <chorus/algorithm/ring_allgather.hpp>
#include <chorus/algorithm/ring_allgatherv.hpp>
#include <chorus/algorithm/ring_allreduce.hpp>
#include <chorus/algorithm/ring_reduce_scatter.hpp>
#include <chorus/algorithm/ring_reduce_scatterv.hpp>
#include <chorus/algorithm/scatter_allgather_broadcast.hpp>
#include <chorus/algorithm/tree_allreduce.hpp>
#include <chorus/algorithm/two_shot_allreduce.hpp>
#include <chorus/algorithm/tree_broadcast.hpp>
#include <chorus/algorithm/tree_reduce.hpp>
#include <chorus/algorithm/tree_reduce_scatter.hpp>
#include <chorus/algorithm/tree_reduce_scatterv.hpp>
#include <chorus/algorithm/zero_copy_allgather.hpp>
#include <chorus/algorithm/zero_copy_alltoall.hpp>
#include <chorus/algorithm/zero_copy_alltoallv.hpp>
#include <chorus/algorithm/zero_copy_broadcast.hpp>
#include <chorus/algorithm/zero_copy_reduce_scatter.hpp>
#include <chorus/detail/dispatch.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/fwd.hpp>
#include <chorus/ranges.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/reduce/ops.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

// Each collective's algorithms, the one list per collective.
using barrier_algorithms = algorithms<collective_kind::barrier, dissemination, one_shot>;
using broadcast_algorithms = algorithms<collective_kind::broadcast, tree, linear, scatter_allgather, hierarchical, one_shot, zero_copy>;
using scatter_algorithms = algorithms<collective_kind::scatter, linear>;
using gather_algorithms = algorithms<collective_kind::gather, linear>;
using allgather_algorithms = algorithms<collective_kind::allgather, ring, bruck, hierarchical, one_shot, zero_copy>;
using reduce_algorithms = algorithms<collective_kind::reduce, tree>;
using allreduce_algorithms =
    algorithms<collective_kind::allreduce, ring, rabenseifner, recursive_doubling, tree, hierarchical, one_shot, two_shot>;
using reduce_scatter_algorithms = algorithms<collective_kind::reduce_scatter, ring, tree, one_shot, zero_copy>;
using alltoall_algorithms = algorithms<collective_kind::alltoall, pairwise, bruck, one_shot, zero_copy>;
using alltoallv_algorithms = algorithms<collective_kind::alltoallv, pairwise, zero_copy>;
using gatherv_algorithms = algorithms<collective_kind::gatherv, linear>;
using scatterv_algorithms = algorithms<collective_kind::scatterv, linear>;
using allgatherv_algorithms = algorithms<collective_kind::allgatherv, ring>;
using reduce_scatterv_algorithms = algorithms<collective_kind::reduce_scatterv, ring, tree>;
using scan_algorithms = algorithms<collective_kind::scan, recursive_doubling>;
using exscan_algorithms = algorithms<collective_kind::exscan, recursive_doubling>;

// The front doors' first check: `Op` reduces `T`. Misuse fails here, at the user's call, with
// Op and T in this function's template arguments, instead of deep inside an algorithm; the
// front door then stops (if constexpr), so this is the only error.
template <class Op, class T>
constexpr bool reduce_op_for() {
    static_assert(reduce_op<Op, T>,
                  "chorus: this reduce op cannot combine two elements of this type (Op and T: this "
                  "instantiation of reduce_op_for): op(a, b) must accept two T const& and return a T");
    return reduce_op<Op, T>;
}

template <class List, class Algo, class T, class Op, class Transport, class... Args>
void run_only(Transport& tp, std::size_t bytes, Args&... args) {
    run_collective<Algo, List, T, Op>(tp, bytes, [] { return List::only(); }, args...);
}

// Both reduce front doors: the op's check, then the one schedule.
template <class Algo, class T, class Op, class Transport, class... Args>
void reduce_door(Transport& tp, std::size_t bytes, Args&... args) {
    if constexpr (reduce_op_for<Op, T>()) run_only<reduce_algorithms, Algo, T, Op>(tp, bytes, args...);
}

// The reduce_scatter schedule for an op: the ring for a commutative one, else the tree.
template <class Op, class T>
choice reduce_scatter_choice() noexcept {
    return is_commutative_v<Op, T> ? choice{ring::name, "commutative op"} : choice{tree::name, "non-commutative op: rank order"};
}

// The scan front doors: the op's check, then the one schedule.
template <class List, class Algo, class T, class Op, class Transport>
void scan_door(Transport& tp, std::span<T const> send, std::span<T> recv, Op& op) {
    if constexpr (reduce_op_for<Op, T>()) run_only<List, Algo, T, Op>(tp, send.size_bytes(), send, recv, op);
}

} // namespace detail

/// Returns once every rank called it. Algorithms: dissemination, one_shot (the automatic
/// choice over a direct_transport).
template <class Algo = automatic, transport Transport>
void barrier(Transport& tp) {
    detail::run_collective<Algo, detail::barrier_algorithms, void, void>(
        tp, 0, [&] { return detail::prefer_direct<void>(tp, 0, 0, {dissemination::name, "the schedule of messages"}); });
}

/// Copies `data` from `root` to every rank, in place. Algorithms: tree (binomial), linear,
/// scatter_allgather (van de Geijn), hierarchical (node_transport), one_shot
/// (direct_transport), zero_copy (exposing_transport); automatic picks tree up to 4 ranks and
/// for small vectors, scatter_allgather for large ones from 5 ranks on, one_shot or zero_copy
/// over the transports that have them (detail/select.hpp).
template <class Algo = automatic, transport Transport, writable_message_range R>
void broadcast(Transport& tp, R&& data, rank_t root) {
    using T = detail::element_t<R>;
    auto s = detail::to_span(data);
    detail::run_collective<Algo, detail::broadcast_algorithms, T, void>(
        tp, s.size_bytes(),
        [&] {
            auto const bytes = s.size_bytes();
            return detail::prefer_direct<T, zero_copy>(tp, bytes, sizeof(T), detail::choose_broadcast_over(tp, bytes));
        },
        s, root);
}

/// Rank r receives block r of the root's `send` (p * recv.size() elements) into `recv`.
/// `send` is read at the root only. Algorithms: linear.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void scatter(Transport& tp, S const& send, R&& recv, rank_t root) {
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_only<detail::scatter_algorithms, Algo, detail::element_t<R>, void>(tp, out.size_bytes(), in, out, root);
}

/// The root receives every rank's `send` into `recv`, in rank order. Algorithms: linear.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void gather(Transport& tp, S const& send, R&& recv, rank_t root) {
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_only<detail::gather_algorithms, Algo, detail::element_t<S>, void>(tp, in.size_bytes(), in, out, root);
}

/// Every rank receives every rank's `send` into `recv`, in rank order. Algorithms: ring,
/// bruck, hierarchical (node_transport), one_shot (direct_transport), zero_copy
/// (exposing_transport); automatic picks bruck when the gathered size is small, ring
/// otherwise, one_shot or zero_copy over the transports that have them.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void allgather(Transport& tp, S const& send, R&& recv) {
    using T = detail::element_t<S>;
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    // By the gathered size, p times the block: what Bruck's log p messages carry.
    std::size_t const gathered = in.size_bytes() * static_cast<std::size_t>(tp.size());
    detail::run_collective<Algo, detail::allgather_algorithms, T, void>(
        tp, gathered,
        [&] {
            return detail::prefer_direct<T, zero_copy>(tp, in.size_bytes(), sizeof(T), detail::choose_allgather_over(tp, gathered));
        },
        in, out);
}

/// Reduces every rank's `send` with `op` into `recv` at `root`. Algorithms: tree.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, class Op>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void reduce(Transport& tp, S const& send, R&& recv, Op op, rank_t root) {
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::reduce_door<Algo, detail::element_t<S>, Op>(tp, in.size_bytes(), in, out, op, root);
}

/// In-place reduce: `data` is the contribution and, at `root`, the result (unchanged elsewhere).
template <class Algo = automatic, transport Transport, writable_message_range R, class Op>
void reduce(Transport& tp, R&& data, Op op, rank_t root) {
    auto s = detail::to_span(data);
    detail::reduce_door<Algo, detail::element_t<R>, Op>(tp, s.size_bytes(), s, op, root);
}

/// Reduces `data` over all ranks with `op` (default sum), in place, on every rank.
/// Algorithms: ring, rabenseifner, recursive_doubling, tree, hierarchical (node_transport),
/// one_shot (direct_transport), two_shot (exposing_transport); automatic picks by size, by the
/// transport and by whether `op` is commutative (ring needs it).
template <class Algo = automatic, transport Transport, writable_message_range R, class Op = sum>
void allreduce(Transport& tp, R&& data, Op op = {}) {
    using T = detail::element_t<R>;
    if constexpr (detail::reduce_op_for<Op, T>()) {
        auto s = detail::to_span(data);
        detail::run_collective<Algo, detail::allreduce_algorithms, T, Op>(
            tp, s.size_bytes(),
            [&] {
                auto const bytes = s.size_bytes();
                return detail::prefer_direct<T, two_shot>(tp, bytes, sizeof(T), detail::choose_allreduce_over(tp, bytes, is_commutative_v<Op, T>));
            },
            s, op);
    }
}

/// Reduces every rank's `send` (p blocks of recv.size() elements) with `op`; rank r receives
/// the reduction of block r. Algorithms: ring (commutative ops), tree (any op), one_shot
/// (direct_transport), zero_copy (exposing_transport); automatic picks one_shot or zero_copy
/// over the transports that have them, else by whether `op` is commutative.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, class Op = sum>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>> && (!count_range<Op>)
void reduce_scatter(Transport& tp, S const& send, R&& recv, Op op = {}) {
    using T = detail::element_t<S>;
    if constexpr (detail::reduce_op_for<Op, T>()) {
        auto in = detail::to_const_span(send);
        auto out = detail::to_span(recv);
        detail::run_collective<Algo, detail::reduce_scatter_algorithms, T, Op>(
            tp, in.size_bytes(),
            [&] {
                return detail::prefer_direct<T, zero_copy>(tp, in.size_bytes(), sizeof(T) * static_cast<std::size_t>(tp.size()),
                                                           detail::reduce_scatter_choice<Op, T>());
            },
            in, out, op);
    }
}

/// Block j of rank i's `send` lands in block i of rank j's `recv` (a distributed transpose).
/// Algorithms: pairwise, bruck (log p rounds, for many ranks and tiny blocks), one_shot
/// (direct_transport), zero_copy (exposing_transport); automatic picks one_shot or zero_copy
/// over the transports that have them.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoall(Transport& tp, S const& send, R&& recv) {
    using T = detail::element_t<S>;
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    std::size_t const block_bytes = in.size_bytes() / static_cast<std::size_t>(tp.size());
    detail::run_collective<Algo, detail::alltoall_algorithms, T, void>(
        tp, in.size_bytes(),
        [&] {
            return detail::prefer_direct<T, zero_copy>(tp, in.size_bytes(), sizeof(T) * static_cast<std::size_t>(tp.size()),
                                                       detail::choose_alltoall(tp.size(), block_bytes));
        },
        in, out);
}

/// Variable-size alltoall: send_counts[j] elements go to rank j, recv_counts[j] come from
/// rank j; blocks are packed in rank order (displacements are the exclusive prefix sums).
/// Algorithms: pairwise, zero_copy (exposing_transport: automatic picks it there once some
/// rank's send buffer is larger than one_shot's slot, agreed in a round of words).
template <class Algo = automatic, transport Transport, message_range S, count_range SendCounts,
          writable_message_range R, count_range RecvCounts>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoallv(Transport& tp, S const& send, SendCounts const& send_counts, R&& recv, RecvCounts const& recv_counts) {
    using T = detail::element_t<S>;
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_collective<Algo, detail::alltoallv_algorithms, T, void>(
        tp, in.size_bytes(), [&] { return detail::choose_alltoallv<T>(tp, in.size_bytes()); }, in, send_counts, out, recv_counts);
}

/// Variable-size alltoall with explicit displacements (element offsets) for every block.
template <class Algo = automatic, transport Transport, message_range S, count_range SendCounts,
          count_range SendDispls, writable_message_range R, count_range RecvCounts, count_range RecvDispls>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoallv(Transport& tp, S const& send, SendCounts const& send_counts, SendDispls const& send_displs, R&& recv,
               RecvCounts const& recv_counts, RecvDispls const& recv_displs) {
    using T = detail::element_t<S>;
    auto in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_collective<Algo, detail::alltoallv_algorithms, T, void>(
        tp, in.size_bytes(), [&] { return detail::choose_alltoallv<T>(tp, in.size_bytes()); }, in, send_counts, send_displs, out,
        recv_counts, recv_displs);
}

/// In-place allgather (MPI_IN_PLACE): `data` holds p blocks; block r is rank r's contribution
/// on entry, and every block holds its rank's on return. The algorithms of allgather.
template <class Algo = automatic, transport Transport, writable_message_range R>
void allgather(Transport& tp, R&& data) {
    using T = detail::element_t<R>;
    auto const all = detail::to_span(data);
    auto const p = static_cast<std::size_t>(tp.size());
    // The own block is copied out first: the schedules read their send buffer while they write
    // the receive buffer, which must not overlap it. One block: 1/p of the output.
    typename Transport::memory_space::template buffer<T> own(all.size() / p);
    if (all.size() % p == 0) Transport::memory_space::copy(own.span(), detail::as_const(detail::slot(all, tp.rank(), own.size())));
    chorus::allgather<Algo>(tp, detail::as_const(own.span()), all);
}

/// In-place alltoall: `data` holds p blocks, block j for rank j on entry, block i from rank i
/// on return. The algorithms of alltoall, through one copy of `data`.
template <class Algo = automatic, transport Transport, writable_message_range R>
void alltoall(Transport& tp, R&& data) {
    auto const all = detail::to_span(data);
    typename Transport::memory_space::template buffer<detail::element_t<R>> copy(all.size());
    Transport::memory_space::copy(copy.span(), detail::as_const(all));
    chorus::alltoall<Algo>(tp, detail::as_const(copy.span()), all);
}

/// The root receives rank r's `send` (recv_counts[r] elements) into `recv`, blocks packed in
/// rank order; `recv` and `recv_counts` are read at the root only. Algorithms: linear.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, count_range Counts>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void gatherv(Transport& tp, S const& send, R&& recv, Counts const& recv_counts, rank_t root) {
    auto const in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_only<detail::gatherv_algorithms, Algo, detail::element_t<S>, void>(tp, in.size_bytes(), in, out, recv_counts,
                                                                                   root);
}

/// Rank r receives send_counts[r] elements of the root's `send` (packed in rank order) into
/// `recv`; `send` and `send_counts` are read at the root only. Algorithms: linear.
template <class Algo = automatic, transport Transport, message_range S, count_range Counts, writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void scatterv(Transport& tp, S const& send, Counts const& send_counts, R&& recv, rank_t root) {
    auto const in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_only<detail::scatterv_algorithms, Algo, detail::element_t<S>, void>(tp, out.size_bytes(), in, send_counts,
                                                                                    out, root);
}

/// Every rank receives rank r's `send` (recv_counts[r] elements) into `recv`, packed in rank
/// order; every rank passes the same counts. Algorithms: ring.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, count_range Counts>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void allgatherv(Transport& tp, S const& send, R&& recv, Counts const& recv_counts) {
    auto const in = detail::to_const_span(send);
    auto out = detail::to_span(recv);
    detail::run_only<detail::allgatherv_algorithms, Algo, detail::element_t<S>, void>(tp, out.size_bytes(), in, out,
                                                                                      recv_counts);
}

/// reduce_scatter with a count per rank (MPI_Reduce_scatter): `send` holds blocks of
/// recv_counts[0], recv_counts[1], ... elements packed in rank order; rank r receives block r's
/// reduction (recv_counts[r] elements). Algorithms: ring (commutative ops), tree (any op).
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, count_range Counts,
          class Op = sum>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void reduce_scatter(Transport& tp, S const& send, R&& recv, Counts const& recv_counts, Op op = {}) {
    using T = detail::element_t<S>;
    if constexpr (detail::reduce_op_for<Op, T>()) {
        auto const in = detail::to_const_span(send);
        auto out = detail::to_span(recv);
        detail::run_collective<Algo, detail::reduce_scatterv_algorithms, T, Op>(
            tp, in.size_bytes(), [] { return detail::reduce_scatter_choice<Op, T>(); }, in, out, recv_counts, op);
    }
}

/// Inclusive prefix reduction (MPI_Scan): rank r receives op(send of rank 0, ..., send of rank
/// r), in rank order (any op). Algorithms: recursive_doubling.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, class Op = sum>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void scan(Transport& tp, S const& send, R&& recv, Op op = {}) {
    detail::scan_door<detail::scan_algorithms, Algo>(tp, detail::to_const_span(send), detail::to_span(recv), op);
}

/// In-place scan: `data` is the contribution and receives the result.
template <class Algo = automatic, transport Transport, writable_message_range R, class Op = sum>
    requires(!std::ranges::range<Op>)  // scan(tp, send, recv) is the other form
void scan(Transport& tp, R&& data, Op op = {}) {
    auto const s = detail::to_span(data);
    detail::scan_door<detail::scan_algorithms, Algo>(tp, detail::as_const(s), s, op);
}

/// Exclusive prefix reduction (MPI_Exscan): rank r receives the reduction over ranks 0 .. r-1;
/// rank 0's `recv` is left as it was. Algorithms: recursive_doubling.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, class Op = sum>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void exscan(Transport& tp, S const& send, R&& recv, Op op = {}) {
    detail::scan_door<detail::exscan_algorithms, Algo>(tp, detail::to_const_span(send), detail::to_span(recv), op);
}

/// In-place exscan: `data` is the contribution and receives the result (kept at rank 0).
template <class Algo = automatic, transport Transport, writable_message_range R, class Op = sum>
    requires(!std::ranges::range<Op>)  // scan(tp, send, recv) is the other form
void exscan(Transport& tp, R&& data, Op op = {}) {
    auto const s = detail::to_span(data);
    detail::scan_door<detail::exscan_algorithms, Algo>(tp, detail::as_const(s), s, op);
}

} // namespace chorus

// Their phases are the collectives above.
#include <chorus/algorithm/hierarchical_allgather.hpp>
#include <chorus/algorithm/hierarchical_allreduce.hpp>
#include <chorus/algorithm/hierarchical_broadcast.hpp>
