// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring reduce-scatter (the seed's 2.5: the first half of ring allreduce).
// Schedule: `send` holds p blocks of n elements; block j's reduction must end at rank j, so
// it starts at rank j + 1 and travels right. In step s = 0 .. p-2 rank r sends the partial
// of block (r - s - 1) (at s = 0, just its own contribution to it) and receives the partial of block
// (r - s - 2), to which it adds its own contribution; at the last step that block is r's
// own, and the sum lands in `recv`. The input is never modified: partials live in two
// n-element scratch buffers (one being sent while the next is received).
// Cost: (p - 1) * (alpha + n * beta + n * gamma): (p-1)/p of the input crosses each link,
// half of an allreduce. Needs a commutative op (see ring_allreduce).

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

/// The ring's steps, shared with ring_reduce_scatterv: `own(i)` is this rank's contribution to
/// block i (any integer i, taken modulo p; blocks may differ in size), `largest` the largest
/// block. Block i's reduction lands in `recv` at rank i.
template <transport Transport, class T, class Op, class Own>
void ring_reduce_scatter_steps(Transport& tp, tag_t tag, Own const& own, std::size_t largest, std::span<T> recv,
                               Op const& op) {
    rank_t const p = tp.size(), me = tp.rank();
    using space = typename Transport::memory_space;
    if (p == 1) space::copy(recv, own(0));
    ring_topology const ring(p);
    typename space::template buffer<T> first(p > 1 ? largest : 0), second(p > 2 ? largest : 0);
    // The partial being sent (outgoing) and the one being received (inbox) never share
    // memory; once a step completed, the outbox may be overwritten with the next partial.
    std::span<T const> outgoing = own(me - 1);
    for (rank_t step = 0; step + 1 < p; ++step) {
        // The incoming partial holds the ranks before this one on block (me - step - 2)'s way.
        std::span<T const> const mine = own(me - step - 2);
        std::span<T> const inbox = first.span().first(mine.size());
        sendrecv(tp, tag, ring.right(me), outgoing, ring.left(me), inbox);
        std::span<T> const target = step + 2 == p ? recv : second.span().first(mine.size());
        space::reduce(target, as_const(inbox), mine, op);
        outgoing = target;
    }
    space::finalize(recv, op, p);
}

} // namespace detail

/// Reduces every rank's `send` (p blocks of recv.size() elements) element-wise with the
/// commutative `op`; rank r receives the reduction of block r in `recv`.
/// @throws chorus::invalid_argument when send.size() != p * recv.size().
template <transport Transport, class T, reduce_op<T> Op>
void ring_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    static_assert(is_commutative_v<Op, T>,
                  "ring_reduce_scatter combines contributions in ring order, which needs a commutative op: "
                  "wrap a commutative function in chorus::commutative(f), or use tree_reduce_scatter");
    rank_t const p = tp.size();
    std::size_t const n = recv.size();
    tag_t const tag =
        detail::begin_blocks(tp, detail::collective_kind::reduce_scatter, "the send buffer", send.size(), "recv.size()", n);
    auto const own = [&](rank_t i) { return detail::slot(send, static_cast<rank_t>(detail::ring_index(i, p)), n); };
    detail::ring_reduce_scatter_steps(tp, tag, own, n, recv, op);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, ring> =
    [](auto&... a) { ring_reduce_scatter(a...); };
}

} // namespace chorus
