// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Linear scatter.
// Schedule: the root sends block r of its p*n-element send buffer to rank r (all sends in
// flight at once) and copies its own block locally; every other rank receives n elements.
// Cost: (p - 1) * alpha + (p - 1) * n * beta at the root, n * beta elsewhere, which is
// bandwidth-optimal at the root (every byte leaves it once).

#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Rank r receives block r of the root's `send` (p * recv.size() elements, in rank order)
/// into `recv`. `send` is read at the root only (it may be empty elsewhere).
/// @throws chorus::invalid_argument for a bad root or when send.size() != p * recv.size()
/// at the root; a receiver whose recv.size() differs from the root's sees size_mismatch.
template <transport Transport, class T>
void linear_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, rank_t root) {
    detail::check_root(tp, root, "scatter");
    rank_t const p = tp.size();
    std::size_t const n = recv.size();
    if (tp.rank() == root) detail::check_blocks(tp, "scatter", "the root's send buffer", send.size(), "recv.size()", n);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::scatter);
    if (tp.rank() != root) {
        detail::recv(tp, tag, root, recv);
        return;
    }
    using space = typename Transport::memory_space;
    std::vector<typename Transport::request> sends;
    sends.reserve(static_cast<std::size_t>(p));
    for (rank_t r = 0; r < p; ++r)
        if (r != root) sends.push_back(tp.isend(r, tag, detail::bytes_of(detail::slot(send, r, n))));
    space::copy(recv, detail::slot(send, root, n));
    for (auto& s : sends) s.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::scatter, linear> = [](auto&... a) { linear_scatter(a...); };
}

} // namespace chorus
