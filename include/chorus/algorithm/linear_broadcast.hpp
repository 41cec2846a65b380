// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Linear broadcast: the naive schedule the seed contrasts with the tree.
// Schedule: the root sends the whole vector to each of the p - 1 other ranks (all sends in
// flight at once); every other rank receives once.
// Cost: (p - 1) * (alpha + n * beta) at the root, which serialises on its link: O(p) latency.

#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Copies `data` from `root` to every rank, in place.
/// Collective: every rank passes the same `root` and the same `data.size()`.
/// @throws chorus::invalid_argument for a bad root; chorus::transport_error on failure.
template <transport Transport, class T>
void linear_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::broadcast);
    if (tp.rank() != root) {
        detail::recv(tp, tag, root, data);
        return;
    }
    std::vector<typename Transport::request> sends;
    sends.reserve(static_cast<std::size_t>(tp.size()));
    for (rank_t r = 0; r < tp.size(); ++r)
        if (r != root) sends.push_back(tp.isend(r, tag, detail::bytes_of(data)));
    for (auto& s : sends) s.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, linear> =
    [](auto&... a) { linear_broadcast(a...); };
}

} // namespace chorus
