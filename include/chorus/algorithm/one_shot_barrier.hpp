// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One-shot barrier over a direct_transport (ranks that read each other's memory).
// Schedule: one exchange round of empty blocks: it returns once every rank published.
// Cost: delta (one round: p - 1 flags read by every rank at once), against dissemination's
// ceil(log2 p) rounds of messages.

#include <algorithm>
#include <cstddef>
#include <span>

#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Returns once every rank called it.
template <direct_transport Transport>
void one_shot_barrier(Transport& tp) {
    detail::direct_rounds round(tp, detail::collective_kind::barrier, 0);
    round(std::span<std::byte const>());
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::barrier, one_shot> = [](auto&... a) { one_shot_barrier(a...); };
}

} // namespace chorus
