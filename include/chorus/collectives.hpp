// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The front doors: one function per collective of the seed, over any transport and any
// contiguous range. The algorithm is a template argument, `allreduce<ring>(tp, v, op)`, or
// chosen at run time when none is given (detail/select.hpp; CHORUS_ALGO overrides it,
// CHORUS_DEBUG logs it). Each algorithm lives in its own header under algorithm/.

#include <concepts>
#include <cstddef>
#include <ranges>
#include <string_view>
#include <span>
#include <type_traits>
#include <utility>

#include <chorus/algorithm/bruck_allgather.hpp>
#include <chorus/algorithm/bruck_alltoall.hpp>
#include <chorus/algorithm/dissemination_barrier.hpp>
#include <chorus/algorithm/linear_broadcast.hpp>
#include <chorus/algorithm/linear_gather.hpp>
#include <chorus/algorithm/linear_scatter.hpp>
#include <chorus/algorithm/pairwise_alltoall.hpp>
#include <chorus/algorithm/pairwise_alltoallv.hpp>
#include <chorus/algorithm/rabenseifner_allreduce.hpp>
#include <chorus/algorithm/recursive_doubling_allreduce.hpp>
#include <chorus/algorithm/ring_allgather.hpp>
#include <chorus/algorithm/ring_allreduce.hpp>
#include <chorus/algorithm/ring_reduce_scatter.hpp>
#include <chorus/algorithm/scatter_allgather_broadcast.hpp>
#include <chorus/algorithm/tree_allreduce.hpp>
#include <chorus/algorithm/tree_broadcast.hpp>
#include <chorus/algorithm/tree_reduce.hpp>
#include <chorus/algorithm/tree_reduce_scatter.hpp>
#include <chorus/detail/ranges.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/reduce/ops.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
template <class>
inline constexpr bool unsupported_algorithm = false;

// For collectives with one schedule: CHORUS_ALGO may still name it (anything else is an
// error) and CHORUS_DEBUG still logs the call.
template <class Algo, transport Transport>
void only_schedule(Transport& tp, std::string_view collective, std::size_t bytes, algorithm_id id) {
    if constexpr (std::same_as<Algo, automatic>) decide(tp, collective, bytes, {id, "the only schedule"}, {id});
}
} // namespace detail

/// Returns once every rank called it. Algorithms: dissemination.
template <class Algo = automatic, transport Transport>
void barrier(Transport& tp) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, dissemination>,
                  "barrier supports the algorithms: dissemination, automatic");
    detail::only_schedule<Algo>(tp, "barrier", 0, detail::algorithm_id::dissemination);
    dissemination_barrier(tp);
}

/// Copies `data` from `root` to every rank, in place. Algorithms: tree (binomial), linear,
/// scatter_allgather (van de Geijn); automatic picks tree up to 4 ranks and for small
/// vectors, scatter_allgather for large ones from 5 ranks on (detail/select.hpp).
template <class Algo = automatic, transport Transport, detail::writable_message_range R>
void broadcast(Transport& tp, R&& data, rank_t root) {
    auto const s = detail::to_span(data);
    if constexpr (std::same_as<Algo, tree>) {
        tree_broadcast(tp, s, root);
    } else if constexpr (std::same_as<Algo, linear>) {
        linear_broadcast(tp, s, root);
    } else if constexpr (std::same_as<Algo, scatter_allgather>) {
        scatter_allgather_broadcast(tp, s, root);
    } else if constexpr (std::same_as<Algo, automatic>) {
        using enum detail::algorithm_id;
        auto const a = detail::decide(tp, "broadcast", s.size_bytes(), detail::choose_broadcast(tp.size(), s.size_bytes()),
                                      {tree, linear, scatter_allgather});
        if (a == linear) linear_broadcast(tp, s, root);
        else if (a == scatter_allgather) scatter_allgather_broadcast(tp, s, root);
        else tree_broadcast(tp, s, root);
    } else {
        static_assert(detail::unsupported_algorithm<Algo>,
                      "broadcast supports the algorithms: tree, linear, scatter_allgather, automatic");
    }
}

/// Rank r receives block r of the root's `send` (p * recv.size() elements) into `recv`.
/// `send` is read at the root only. Algorithms: linear.
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void scatter(Transport& tp, S const& send, R&& recv, rank_t root) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, linear>,
                  "scatter supports the algorithms: linear, automatic");
    detail::only_schedule<Algo>(tp, "scatter", std::ranges::size(recv) * sizeof(detail::element_t<R>), detail::algorithm_id::linear);
    linear_scatter(tp, detail::to_const_span(send), detail::to_span(recv), root);
}

/// The root receives every rank's `send` into `recv`, in rank order. Algorithms: linear.
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void gather(Transport& tp, S const& send, R&& recv, rank_t root) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, linear>,
                  "gather supports the algorithms: linear, automatic");
    detail::only_schedule<Algo>(tp, "gather", std::ranges::size(send) * sizeof(detail::element_t<S>), detail::algorithm_id::linear);
    linear_gather(tp, detail::to_const_span(send), detail::to_span(recv), root);
}

/// Every rank receives every rank's `send` into `recv`, in rank order. Algorithms: ring,
/// bruck; automatic picks bruck when the gathered size is small, ring otherwise.
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void allgather(Transport& tp, S const& send, R&& recv) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    if constexpr (std::same_as<Algo, ring>) {
        ring_allgather(tp, in, out);
    } else if constexpr (std::same_as<Algo, bruck>) {
        bruck_allgather(tp, in, out);
    } else if constexpr (std::same_as<Algo, automatic>) {
        using enum detail::algorithm_id;
        // By the gathered size, p times the block: what Bruck's log p messages carry.
        std::size_t const gathered = in.size_bytes() * static_cast<std::size_t>(tp.size());
        if (detail::decide(tp, "allgather", gathered, detail::choose_allgather(tp.size(), gathered), {ring, bruck}) == bruck)
            bruck_allgather(tp, in, out);
        else
            ring_allgather(tp, in, out);
    } else {
        static_assert(detail::unsupported_algorithm<Algo>, "allgather supports the algorithms: ring, bruck, automatic");
    }
}

/// Reduces every rank's `send` with `op` into `recv` at `root`. Algorithms: tree.
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R, class Op>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>> && reduce_op<Op, detail::element_t<S>>
void reduce(Transport& tp, S const& send, R&& recv, Op op, rank_t root) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, tree>,
                  "reduce supports the algorithms: tree, automatic");
    detail::only_schedule<Algo>(tp, "reduce", std::ranges::size(send) * sizeof(detail::element_t<S>), detail::algorithm_id::tree);
    tree_reduce(tp, detail::to_const_span(send), detail::to_span(recv), op, root);
}

/// In-place reduce: `data` is the contribution and, at `root`, the result (unchanged elsewhere).
template <class Algo = automatic, transport Transport, detail::writable_message_range R, class Op>
    requires reduce_op<Op, detail::element_t<R>>
void reduce(Transport& tp, R&& data, Op op, rank_t root) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, tree>,
                  "reduce supports the algorithms: tree, automatic");
    detail::only_schedule<Algo>(tp, "reduce", std::ranges::size(data) * sizeof(detail::element_t<R>), detail::algorithm_id::tree);
    tree_reduce(tp, detail::to_span(data), op, root);
}

/// Reduces `data` over all ranks with `op` (default sum), in place, on every rank.
/// Algorithms: ring, rabenseifner, recursive_doubling, tree; automatic picks by size and
/// by whether `op` is commutative (ring needs it).
template <class Algo = automatic, transport Transport, detail::writable_message_range R, class Op = sum>
    requires reduce_op<Op, detail::element_t<R>>
void allreduce(Transport& tp, R&& data, Op op = {}) {
    using T = detail::element_t<R>;
    auto const s = detail::to_span(data);
    if constexpr (std::same_as<Algo, ring>) {
        ring_allreduce(tp, s, op);
    } else if constexpr (std::same_as<Algo, rabenseifner>) {
        rabenseifner_allreduce(tp, s, op);
    } else if constexpr (std::same_as<Algo, recursive_doubling>) {
        recursive_doubling_allreduce(tp, s, op);
    } else if constexpr (std::same_as<Algo, tree>) {
        tree_allreduce(tp, s, op);
    } else if constexpr (std::same_as<Algo, automatic>) {
        using enum detail::algorithm_id;
        constexpr bool commutes = is_commutative_v<Op, T>;
        auto const chosen = detail::choose_allreduce(tp.size(), s.size_bytes(), commutes);
        auto const a = commutes ? detail::decide(tp, "allreduce", s.size_bytes(), chosen,
                                                 {ring, rabenseifner, recursive_doubling, tree})
                                : detail::decide(tp, "allreduce", s.size_bytes(), chosen,
                                                 {rabenseifner, recursive_doubling, tree});
        if constexpr (commutes) {
            if (a == ring) return ring_allreduce(tp, s, op);
        }
        if (a == rabenseifner) rabenseifner_allreduce(tp, s, op);
        else if (a == tree) tree_allreduce(tp, s, op);
        else recursive_doubling_allreduce(tp, s, op);
    } else {
        static_assert(detail::unsupported_algorithm<Algo>,
                      "allreduce supports the algorithms: ring, rabenseifner, recursive_doubling, tree, automatic");
    }
}

/// Reduces every rank's `send` (p blocks of recv.size() elements) with `op`; rank r receives
/// the reduction of block r. Algorithms: ring (commutative ops), tree (any op).
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R,
          class Op = sum>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>> && reduce_op<Op, detail::element_t<S>>
void reduce_scatter(Transport& tp, S const& send, R&& recv, Op op = {}) {
    using T = detail::element_t<S>;
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    if constexpr (std::same_as<Algo, ring>) {
        ring_reduce_scatter(tp, in, out, op);
    } else if constexpr (std::same_as<Algo, tree>) {
        tree_reduce_scatter(tp, in, out, op);
    } else if constexpr (std::same_as<Algo, automatic>) {
        using enum detail::algorithm_id;
        if constexpr (is_commutative_v<Op, T>) {
            if (detail::decide(tp, "reduce_scatter", in.size_bytes(), {ring, "commutative op"}, {ring, tree}) == ring)
                return ring_reduce_scatter(tp, in, out, op);
        } else {
            detail::decide(tp, "reduce_scatter", in.size_bytes(), {tree, "non-commutative op: rank order"}, {tree});
        }
        tree_reduce_scatter(tp, in, out, op);
    } else {
        static_assert(detail::unsupported_algorithm<Algo>, "reduce_scatter supports the algorithms: ring, tree, automatic");
    }
}

/// Block j of rank i's `send` lands in block i of rank j's `recv` (a distributed transpose).
/// Algorithms: pairwise, bruck (log p rounds, for many ranks and tiny blocks).
template <class Algo = automatic, transport Transport, detail::message_range S, detail::writable_message_range R>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoall(Transport& tp, S const& send, R&& recv) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    if constexpr (std::same_as<Algo, pairwise>) {
        pairwise_alltoall(tp, in, out);
    } else if constexpr (std::same_as<Algo, bruck>) {
        bruck_alltoall(tp, in, out);
    } else if constexpr (std::same_as<Algo, automatic>) {
        using enum detail::algorithm_id;
        std::size_t const block_bytes = in.size_bytes() / static_cast<std::size_t>(tp.size());
        if (detail::decide(tp, "alltoall", in.size_bytes(), detail::choose_alltoall(tp.size(), block_bytes),
                           {pairwise, bruck}) == bruck)
            bruck_alltoall(tp, in, out);
        else
            pairwise_alltoall(tp, in, out);
    } else {
        static_assert(detail::unsupported_algorithm<Algo>, "alltoall supports the algorithms: pairwise, bruck, automatic");
    }
}

/// Variable-size alltoall: send_counts[j] elements go to rank j, recv_counts[j] come from
/// rank j; blocks are packed in rank order (displacements are the exclusive prefix sums).
/// Algorithms: pairwise.
template <class Algo = automatic, transport Transport, detail::message_range S, count_range SendCounts,
          detail::writable_message_range R, count_range RecvCounts>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoallv(Transport& tp, S const& send, SendCounts const& send_counts, R&& recv, RecvCounts const& recv_counts) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, pairwise>,
                  "alltoallv supports the algorithms: pairwise, automatic");
    detail::only_schedule<Algo>(tp, "alltoallv", std::ranges::size(send) * sizeof(detail::element_t<S>), detail::algorithm_id::pairwise);
    pairwise_alltoallv(tp, detail::to_const_span(send), send_counts, detail::to_span(recv), recv_counts);
}

/// Variable-size alltoall with explicit displacements (element offsets) for every block.
template <class Algo = automatic, transport Transport, detail::message_range S, count_range SendCounts,
          count_range SendDispls, detail::writable_message_range R, count_range RecvCounts, count_range RecvDispls>
    requires std::same_as<detail::element_t<S>, detail::element_t<R>>
void alltoallv(Transport& tp, S const& send, SendCounts const& send_counts, SendDispls const& send_displs, R&& recv,
               RecvCounts const& recv_counts, RecvDispls const& recv_displs) {
    static_assert(std::same_as<Algo, automatic> || std::same_as<Algo, pairwise>,
                  "alltoallv supports the algorithms: pairwise, automatic");
    detail::only_schedule<Algo>(tp, "alltoallv", std::ranges::size(send) * sizeof(detail::element_t<S>), detail::algorithm_id::pairwise);
    pairwise_alltoallv(tp, detail::to_const_span(send), send_counts, send_displs, detail::to_span(recv), recv_counts,
                       recv_displs);
}

} // namespace chorus
