// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Dissemination barrier (Hensgen, Finkel, Manber 1988).
// Schedule: in round k = 0, 1, ..., ceil(log2 p) - 1 rank r sends a zero-byte message to
// r + 2^k and receives one from r - 2^k (mod p). After round k, r has heard (transitively)
// from the 2^(k+1) - 1 ranks before it, so after the last round from all p - 1 others:
// no rank leaves before every rank has arrived.
// Cost: ceil(log2 p) * alpha; no payload. Unlike a tree barrier it has no root to wait on.

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Returns once every rank of `tp` has called it.
/// @throws chorus::transport_error (timeout_error naming a rank that never arrived).
template <transport Transport>
void dissemination_barrier(Transport& tp) {
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::barrier);
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    for (rank_t distance = 1; distance < p; distance *= 2)
        detail::sendrecv(tp, tag, (me + distance) % p, std::span<std::byte const>(), (me - distance + p) % p,
                         std::span<std::byte>());
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::barrier, dissemination> =
    [](auto&... a) { dissemination_barrier(a...); };
}

} // namespace chorus
