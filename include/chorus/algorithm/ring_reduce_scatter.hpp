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

/// Reduces every rank's `send` (p blocks of recv.size() elements) element-wise with the
/// commutative `op`; rank r receives the reduction of block r in `recv`.
/// @throws chorus::invalid_argument when send.size() != p * recv.size().
template <transport Transport, class T, reduce_op<T> Op>
void ring_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    static_assert(is_commutative_v<Op, T>,
                  "ring_reduce_scatter combines contributions in ring order, which needs a commutative op: "
                  "wrap a commutative function in chorus::commutative(f), or use tree_reduce_scatter");
    rank_t const p = tp.size(), me = tp.rank();
    std::size_t const n = recv.size();
    tag_t const tag =
        detail::begin_blocks(tp, detail::collective_kind::reduce_scatter, "the send buffer", send.size(), "recv.size()", n);
    using space = typename Transport::memory_space;
    auto const own = [&](rank_t i) { return detail::slot(send, static_cast<rank_t>(detail::ring_index(i, p)), n); };
    if (p == 1) space::copy(recv, own(0));
    ring_topology const ring(p);
    typename space::template buffer<T> first(p > 1 ? n : 0), second(p > 2 ? n : 0);
    // The partial being sent (outbox) and the one being received (inbox) never share memory;
    // once a step completed, the outbox may be overwritten with the next partial.
    std::span<T> const inbox = first.span(), outbox = second.span();
    std::span<T const> outgoing = own(me - 1);
    for (rank_t step = 0; step + 1 < p; ++step) {
        detail::sendrecv(tp, tag, ring.right(me), outgoing, ring.left(me), inbox);
        bool const last = step + 2 == p;
        // The incoming partial holds the ranks before this one on block (me - step - 2)'s way.
        space::reduce(last ? recv : outbox, detail::as_const(inbox), own(me - step - 2), op);
        outgoing = outbox;
    }
    space::finalize(recv, op, p);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, ring> =
    [](auto&... a) { ring_reduce_scatter(a...); };
}

} // namespace chorus
