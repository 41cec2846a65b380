// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Bruck allgather (Bruck, Ho, Kipnis, Upfal, Weathersby 1997): the latency-optimal
// allgather for small blocks, for any p.
// Schedule: rank r keeps a scratch buffer of p blocks whose block i is destined to hold
// rank r + i's block (mod p); block 0 is its own. In round k = 0 .. ceil(log2 p) - 1, with
// d = 2^k, it sends its first min(d, p - d) blocks to rank r - d and receives as many from
// rank r + d into blocks d, d + 1, ...: after round k it holds blocks 0 .. min(2d, p) - 1.
// A final local rotation puts block i at place r + i of `recv`.
// Cost: ceil(log2 p) * alpha + (p - 1) * n * beta, plus a copy of the p n gathered
// elements; against the ring's (p - 1) * alpha the same bytes in log2 p messages, so it is
// the choice for small totals (detail/select.hpp). For p <= 3 the two take as many rounds.
// Scratch: p * n elements.

#include <algorithm>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Every rank receives every rank's `send` into `recv`, in rank order.
/// @throws chorus::invalid_argument when recv.size() != p * send.size().
template <transport Transport, class T>
void bruck_allgather(Transport& tp, std::span<T const> send, std::span<T> recv) {
    rank_t const p = tp.size(), me = tp.rank();
    std::size_t const n = send.size();
    tag_t const tag =
        detail::begin_blocks(tp, detail::collective_kind::allgather, "the receive buffer", recv.size(), "send.size()", n);
    using space = typename Transport::memory_space;
    if (p == 1) return space::copy(recv, send);
    auto const parts = static_cast<std::size_t>(p);
    typename space::template buffer<T> gathered(parts * n);
    std::span<T> const g = gathered.span();
    space::copy(g.first(n), send);
    for (rank_t d = 1; d < p; d *= 2) {
        auto const count = static_cast<std::size_t>(std::min(d, p - d)) * n;
        detail::sendrecv(tp, tag, (me - d + p) % p, detail::as_const(g.first(count)), (me + d) % p,
                         g.subspan(static_cast<std::size_t>(d) * n, count));
    }
    // g holds ranks me, me + 1, ..., p - 1, 0, ..., me - 1.
    std::size_t const head = (parts - static_cast<std::size_t>(me)) * n;
    space::copy(recv.subspan(static_cast<std::size_t>(me) * n), detail::as_const(g.first(head)));
    space::copy(recv.first(static_cast<std::size_t>(me) * n), detail::as_const(g.subspan(head)));
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allgather, bruck> =
    [](auto&... a) { bruck_allgather(a...); };
}

} // namespace chorus
