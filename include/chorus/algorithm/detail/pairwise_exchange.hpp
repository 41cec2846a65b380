// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The pairwise exchange behind alltoall and alltoallv (the seed's 2.6: "N rounds of
// SendRecv; in round k rank i sends the block for rank (i + k) % N").
// Schedule: round k = 1 .. p-1 sends to r + k and receives from r - k; rounds are posted in
// windows of up to `window` rounds, so several messages are in flight on different links
// while no rank floods a single peer. The own block is a local copy, made while the first
// window's messages move.
// Cost: (p - 1) * alpha / window-overlap + (p - 1)/p * S * beta per rank for S bytes sent.

#include <algorithm>
#include <span>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

inline constexpr rank_t pairwise_window = 8;

/// `send_block(r)` is the span for rank r, `recv_block(r)` the span to fill from rank r, part of
/// an output of `whole` bytes.
template <transport Transport, class SendBlock, class RecvBlock>
void pairwise_exchange(Transport& tp, tag_t tag, SendBlock send_block, RecvBlock recv_block, std::size_t whole) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    // The own block is copied once the first window's messages are out, while the peers move
    // them (a peer that reads this rank's memory, shm's remote messages, reads meanwhile).
    auto const copy_own = [&] { copy_part<typename Transport::memory_space>(recv_block(me), send_block(me), whole); };
    if (p == 1) copy_own();
    std::vector<typename Transport::request> in_flight;
    in_flight.reserve(2 * static_cast<std::size_t>(std::min(p, pairwise_window)));
    for (rank_t first = 1; first < p; first += pairwise_window) {
        rank_t const last = std::min(p, first + pairwise_window);
        for (rank_t k = first; k < last; ++k) {
            rank_t const src = (me - k + p) % p;
            in_flight.push_back(tp.irecv(src, tag, writable_bytes_of(recv_block(src))));
        }
        for (rank_t k = first; k < last; ++k) {
            rank_t const dst = (me + k) % p;
            in_flight.push_back(tp.isend(dst, tag, bytes_of(send_block(dst))));
        }
        if (first == 1) copy_own();
        for (auto& r : in_flight) r.wait();
        in_flight.clear();
    }
}

} // namespace chorus::detail
