// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Bruck alltoall (Bruck, Ho, Kipnis, Upfal, Weathersby 1997): log2 p rounds instead of
// p - 1 messages, for small equal blocks.
// Schedule: rank r rotates its blocks so that scratch block i is the one for rank r + i
// (mod p). In round k = 0 .. ceil(log2 p) - 1, with d = 2^k, it packs every scratch block
// whose index has bit k set, sends the pack to rank r + d, receives as many blocks from
// rank r - d and unpacks them into the same indices. A block at index i travels the
// distances of i's set bits, i.e. exactly i ranks, so at the end index i holds the block
// that rank r - i sent to r, which the inverse rotation puts into place r - i of `recv`.
// Cost: ceil(log2 p) * alpha + ceil(log2 p) * ceil(p/2) * n * beta, plus the local
// packing (about 2 log2 p * p/2 * n element copies and two rotations): fewer messages
// than pairwise's p - 1, but each block crosses up to log2 p links. Only worth it when the
// per-message cost dominates: many ranks, tiny blocks (detail/select.hpp).
// Scratch: p * n elements for the rotated blocks and 2 * ceil(p/2) * n for the packs.

#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Rank j receives block j of every rank's `send` into block i (for sender i) of `recv`.
/// Both buffers hold p equal blocks.
/// @throws chorus::invalid_argument when the sizes differ or are not a multiple of p.
template <transport Transport, class T>
void bruck_alltoall(Transport& tp, std::span<T const> send, std::span<T> recv) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const parts = static_cast<std::size_t>(p);
    detail::check_alltoall_blocks(tp, send.size(), recv.size());
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::alltoall);
    using space = typename Transport::memory_space;
    std::size_t const n = send.size() / parts;
    auto const at = [p](rank_t i) { return static_cast<rank_t>(detail::ring_index(i, p)); };
    if (p == 1) return space::copy(recv, send);

    std::size_t const most = (parts + 1) / 2;  // indices with a given bit set, at most
    typename space::template buffer<T> scratch((parts + 2 * most) * n);
    std::span<T> const rotated = scratch.span().first(parts * n);
    std::span<T> const out = scratch.span().subspan(parts * n, most * n);
    std::span<T> const in = scratch.span().subspan((parts + most) * n, most * n);
    for (rank_t i = 0; i < p; ++i)
        space::copy(detail::slot(rotated, i, n), detail::slot(send, at(me + i), n));
    for (rank_t d = 1; d < p; d *= 2) {
        std::size_t count = 0;
        for (rank_t i = d; i < p; ++i)
            if (i & d) space::copy(detail::slot(out, static_cast<rank_t>(count++), n), detail::as_const(detail::slot(rotated, i, n)));
        detail::sendrecv(tp, tag, at(me + d), detail::as_const(out.first(count * n)), at(me - d), in.first(count * n));
        count = 0;
        for (rank_t i = d; i < p; ++i)
            if (i & d) space::copy(detail::slot(rotated, i, n), detail::as_const(detail::slot(in, static_cast<rank_t>(count++), n)));
    }
    for (rank_t i = 0; i < p; ++i)
        space::copy(detail::slot(recv, at(me - i), n), detail::as_const(detail::slot(rotated, i, n)));
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoall, bruck> = [](auto&... a) { bruck_alltoall(a...); };
}

} // namespace chorus
