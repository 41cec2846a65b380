// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Linear gather, the inverse of linear_scatter.
// Schedule: every rank sends its n elements to the root; the root posts all p - 1 receives
// at once, straight into block r of its receive buffer, and copies its own block locally.
// Cost: (p - 1) * alpha + (p - 1) * n * beta at the root.

#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// The root receives every rank's `send` into `recv`, in rank order (p * send.size()
/// elements). `recv` is written at the root only (it may be empty elsewhere).
/// @throws chorus::invalid_argument for a bad root or when recv.size() != p * send.size()
/// at the root; a sender whose send.size() differs from the root's causes size_mismatch.
template <transport Transport, class T>
void linear_gather(Transport& tp, std::span<T const> send, std::span<T> recv, rank_t root) {
    detail::check_root(tp, root, "gather");
    rank_t const p = tp.size();
    std::size_t const n = send.size();
    if (tp.rank() == root) detail::check_blocks(tp, "gather", "the root's receive buffer", recv.size(), "send.size()", n);
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::gather);
    if (tp.rank() != root) {
        detail::send(tp, tag, root, send);
        return;
    }
    using space = typename Transport::memory_space;
    std::vector<typename Transport::request> recvs;
    recvs.reserve(static_cast<std::size_t>(p));
    for (rank_t r = 0; r < p; ++r)
        if (r != root) recvs.push_back(tp.irecv(r, tag, detail::writable_bytes_of(detail::slot(recv, r, n))));
    detail::copy_part<space>(detail::slot(recv, root, n), send, recv.size_bytes());
    for (auto& r : recvs) r.wait();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::gather, linear> = [](auto&... a) { linear_gather(a...); };
}

} // namespace chorus
