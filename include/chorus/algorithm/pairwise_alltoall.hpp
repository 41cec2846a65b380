// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Pairwise alltoall: a distributed transpose (the seed's 2.6). Block j of rank i's `send`
// lands in block i of rank j's `recv`.
// Schedule: detail::pairwise_exchange (round k talks to r + k and r - k, windows of rounds
// in flight). Cost: (p - 1) * alpha + (p - 1) * n * beta per rank for n-element blocks.

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/pairwise_exchange.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Rank j receives block j of every rank's `send` into block i (for sender i) of `recv`.
/// Both buffers hold p equal blocks.
/// @throws chorus::invalid_argument when the sizes differ or are not a multiple of p.
template <transport Transport, class T>
void pairwise_alltoall(Transport& tp, std::span<T const> send, std::span<T> recv) {
    rank_t const p = tp.size();
    detail::check_alltoall_blocks(tp, send.size(), recv.size());
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::alltoall);
    std::size_t const n = send.size() / static_cast<std::size_t>(p);
    detail::pairwise_exchange(
        tp, tag, [&](rank_t r) { return detail::slot(send, r, n); }, [&](rank_t r) { return detail::slot(recv, r, n); },
        recv.size_bytes());
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoall, pairwise> =
    [](auto&... a) { pairwise_alltoall(a...); };
}

} // namespace chorus
