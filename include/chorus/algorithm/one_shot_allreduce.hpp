// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot allreduce over a direct_transport (ranks that read each other's memory).
// Schedule: rounds of the direct exchange, each of at most D bytes (the transport's
// direct_bytes): every rank publishes the next part of its vector in its own memory; once all
// have, each folds the p parts in rank order into its own, reading its peers' where they lie
// (its own from its buffer, not from the published copy).
// Cost: R delta (R = ceil(nb / D) rounds, a flag per peer each) + n * beta (the publish) +
// (p - 1) * n * (beta + gamma), every rank at once: on one host one round is a cache line each
// way, against recursive doubling's log2 p messages, each a record written, read and matched.
// For small vectors (the reads grow with p, where the ring's stay flat). Every rank combines
// the same operands in the same order: results agree bit for bit, non-commutative ops are
// served.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <direct_transport Transport, class T, reduce_op<T> Op>
void one_shot_allreduce(Transport& tp, std::span<T> data, Op op) {
    detail::direct_rounds round(tp, detail::collective_kind::allreduce, data.size_bytes());
    std::size_t const k = round.per_round(sizeof(T));
    for (std::size_t c = 0, rounds = detail::direct_round_count(data.size(), k); c < rounds; ++c) {
        std::span<T> const part = data.subspan(c * k, std::min(k, data.size() - c * k));
        round(detail::bytes_of(part));
        detail::direct_fold(tp, detail::as_const(part), part, 0, op);
    }
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, one_shot> = [](auto&... a) { one_shot_allreduce(a...); };
}

} // namespace chorus
