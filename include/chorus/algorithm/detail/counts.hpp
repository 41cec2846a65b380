// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Per-rank counts of the v-collectives (alltoallv, gatherv, scatterv, allgatherv,
// reduce_scatter with counts): checked once, as size_t, and their packed displacements.

#include <concepts>
#include <cstddef>
#include <ranges>
#include <string>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

/// `counts` as size_t, one per rank; a wrong length or a negative entry fails the group.
template <transport Transport, class R>
std::vector<std::size_t> checked_counts(Transport& tp, R const& counts, char const* collective, char const* what) {
    auto const p = static_cast<std::size_t>(tp.size());
    check_size(tp, std::ranges::size(counts) == p, collective,
               std::string(what) + " has " + std::to_string(std::ranges::size(counts)) + " entries, expected one per rank (" +
                   std::to_string(p) + ")");
    std::vector<std::size_t> out;
    out.reserve(p);
    for (auto c : counts) {
        if constexpr (std::signed_integral<decltype(c)>)
            check_size(tp, c >= 0, collective, std::string(what) + " has a negative entry " + std::to_string(c));
        out.push_back(static_cast<std::size_t>(c));
    }
    return out;
}

/// The packed layout's displacements: the exclusive prefix sums of the counts.
inline std::vector<std::size_t> exclusive_prefix_sum(std::vector<std::size_t> const& counts) {
    std::vector<std::size_t> displs(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
        displs[i] = total;
        total += counts[i];
    }
    return displs;
}

/// The sum of the counts.
inline std::size_t total_of(std::vector<std::size_t> const& counts) noexcept {
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    return total;
}

/// Checks that a buffer of `have` elements holds the packed blocks of `counts`.
template <transport Transport>
void check_packed(Transport& tp, char const* collective, char const* buffer, std::size_t have, char const* what,
                  std::vector<std::size_t> const& counts) {
    std::size_t const total = total_of(counts);
    if (have != total)
        fail_argument(tp, std::string(collective) + ": " + what + " sum to " + std::to_string(total) + " but " + buffer +
                              " holds " + std::to_string(have) + " elements");
}

} // namespace chorus::detail

namespace chorus::detail {

/// The counts of a reduce_scatter with per-rank counts, checked against its buffers: `send`
/// holds every block, `recv` this rank's.
template <transport Transport, class R>
std::vector<std::size_t> reduce_scatterv_counts(Transport& tp, R const& recv_counts, std::size_t send, std::size_t recv) {
    auto counts = checked_counts(tp, recv_counts, "reduce_scatter", "recv_counts");
    check_packed(tp, "reduce_scatter", "the send buffer", send, "recv_counts", counts);
    std::size_t const mine = counts[static_cast<std::size_t>(tp.rank())];
    check_size(tp, mine == recv, "reduce_scatter",
               "recv_counts[" + std::to_string(tp.rank()) + "] is " + std::to_string(mine) + " but the receive buffer holds " +
                   std::to_string(recv) + " elements");
    return counts;
}

} // namespace chorus::detail
