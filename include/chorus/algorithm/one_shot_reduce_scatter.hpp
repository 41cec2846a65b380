// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot reduce_scatter over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes), in which every rank publishes the next part of each of its p blocks; each
// then folds part `me` of every rank's, in rank order, into its receive buffer.
// Cost: R delta (R = ceil(p nb / D)) + p * n * beta (the publish) + (p - 1) * n * (beta +
// gamma), every rank at once, against the ring's p - 1 messages. For small blocks. Rank
// order: any op.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces every rank's `send` (p blocks of recv.size() elements) with `op`; rank r receives
/// the reduction of block r.
template <direct_transport Transport, class T, reduce_op<T> Op>
void one_shot_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    detail::check_blocks(tp, "reduce_scatter", "send", send.size(), "recv.size()", recv.size());
    rank_t const me = tp.rank();
    std::size_t const n = recv.size();
    detail::direct_block_rounds(tp, detail::collective_kind::reduce_scatter, send, n, [&](std::size_t first, std::size_t len) {
        detail::direct_fold(tp, detail::slot(send, me, n).subspan(first, len), recv.subspan(first, len),
                            static_cast<std::size_t>(me) * len, op);
    });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, one_shot> =
    [](auto&... a) { one_shot_reduce_scatter(a...); };
}

} // namespace chorus
