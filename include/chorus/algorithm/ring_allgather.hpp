// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring allgather (the seed's 2.3).
// Schedule: rank r first copies its own n elements into block r of `recv`. In step
// s = 0 .. p-2 it sends block (r - s) to its right neighbour and receives block (r - s - 1)
// from its left neighbour, straight into place. After step s, r holds blocks r - s - 1 .. r;
// after p - 1 steps, all of them. All p - 1 receives are posted up front (they land in
// distinct places) and each block is forwarded the moment it arrived, without waiting for
// the previous send: a rank is never idle between steps.
// Cost: (p - 1) * alpha + (p - 1) * n * beta per rank, bandwidth-optimal ((p-1)/p of the
// gathered size crosses each link once).

#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

/// The ring allgather's steps over p blocks, shared with scatter_allgather_broadcast. Ring
/// position v of this rank (its rank, or its distance from a root); `block(i)` is block i's
/// span (i = 0 .. p-1, the same layout on every rank); `holds(u, i)` says whether the rank
/// at position u already holds block i before the ring starts (at least its own, i == u;
/// the same answer on every rank). In step s position v sends block v - s to v + 1 unless
/// v + 1 holds it, and receives block v - s - 1 unless it holds it itself, so no block
/// travels to a rank that has it and no receive writes into a block this rank holds (which
/// may still be in flight to someone else).
template <transport Transport, class Block, class Holds>
void ring_allgather_steps(Transport& tp, tag_t tag, rank_t v, Block block, Holds holds) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    ring_topology const ring(p);
    auto const at = [p](rank_t i) { return static_cast<rank_t>(ring_index(i, p)); };
    std::vector<typename Transport::request> recvs, sends;
    recvs.reserve(static_cast<std::size_t>(p));
    sends.reserve(static_cast<std::size_t>(p));
    // recv_of[s]: the index in `recvs` of step s's receive (when this rank lacks the block).
    std::vector<std::size_t> recv_of(static_cast<std::size_t>(p), 0);
    for (rank_t s = 0; s + 1 < p; ++s) {
        rank_t const i = at(v - s - 1);
        if (holds(v, i)) continue;
        recv_of[static_cast<std::size_t>(s)] = recvs.size();
        recvs.push_back(tp.irecv(ring.left(me), tag, writable_bytes_of(block(i))));
    }
    std::size_t waited = 0;
    for (rank_t s = 0; s + 1 < p; ++s) {
        rank_t const i = at(v - s);
        if (!holds(v, i)) {
            // Block i arrived in step s - 1 (the receives complete in order).
            for (std::size_t const until = recv_of[static_cast<std::size_t>(s - 1)]; waited <= until; ++waited)
                recvs[waited].wait();
        }
        if (!holds(at(v + 1), i)) sends.push_back(tp.isend(ring.right(me), tag, bytes_of(as_const(block(i)))));
    }
    for (; waited < recvs.size(); ++waited) recvs[waited].wait();
    for (auto& s : sends) s.wait();
}

} // namespace detail

/// Every rank receives every rank's `send` into `recv`, in rank order.
/// @throws chorus::invalid_argument when recv.size() != p * send.size().
template <transport Transport, class T>
void ring_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    rank_t const me = tp.rank();
    std::size_t const n = send.size();
    tag_t const tag =
        detail::begin_blocks(tp, detail::collective_kind::allgather, "the receive buffer", recv.size(), "send.size()", n);
    detail::copy_part<typename Transport::memory_space>(detail::slot(recv, me, n), send, recv.size_bytes());
    detail::ring_allgather_steps(
        tp, tag, me, [&](rank_t i) { return detail::slot(recv, i, n); }, [](rank_t u, rank_t i) { return u == i; });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allgather, ring> = [](auto&... a) { ring_allgather(a...); };
}

} // namespace chorus
