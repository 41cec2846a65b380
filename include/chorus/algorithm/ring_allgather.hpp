// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring allgather (the seed's 2.3).
// Schedule: rank r first copies its own n elements into block r of `recv`. In step
// s = 0 .. p-2 it sends block (r - s) to its right neighbour and receives block (r - s - 1)
// from its left neighbour, straight into place. After step s, r holds blocks r - s - 1 .. r;
// after p - 1 steps, all of them.
// Cost: (p - 1) * alpha + (p - 1) * n * beta per rank, bandwidth-optimal ((p-1)/p of the
// gathered size crosses each link once).

#include <span>

#include <chorus/detail/collective.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives every rank's `send` into `recv`, in rank order.
/// @throws chorus::invalid_argument when recv.size() != p * send.size().
template <transport Transport, class T>
void ring_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    std::size_t const n = send.size();
    detail::check_blocks(tp, "allgather", "the receive buffer", recv.size(), "send.size()", n);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::allgather);
    using space = typename Transport::memory_space;
    space::copy(detail::slot(recv, me, n), send);
    ring_topology const ring(p);
    for (rank_t step = 0; step + 1 < p; ++step) {
        auto const out = detail::slot(recv, static_cast<rank_t>(detail::ring_index(me - step, p)), n);
        auto const in = detail::slot(recv, static_cast<rank_t>(detail::ring_index(me - step - 1, p)), n);
        detail::sendrecv(tp, tag, ring.right(me), detail::as_const(out), ring.left(me), in);
    }
}

} // namespace chorus
