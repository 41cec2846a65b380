// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy variable-size alltoall over an exposing_transport (ranks that read each other's
// buffers where they lie: CUDA IPC; shm_transport, in registered shm_buffers): MoE token dispatch and combine without staging copies.
// Schedule: two rounds, no message.
//   1. Every rank exposes its `send` in parts: part j, its block for rank j, goes to rank j with
//      its place and size (the transport carries them host-side, as it carries every round's
//      shape). Each rank checks that every peer's block for it is the size it expects, then
//      copies each from where it lies into place (its own from `send`). A peer whose block for
//      a rank is empty is not even opened by it.
//   2. An empty round: no rank returns, and lets its caller write or free `send`, while a peer
//      may still read it (each closes what it opened once its reads completed).
// Cost: 2 delta + (bytes received) * beta per rank, every rank at once, each block read once,
// where pairwise copies every block twice (into the receiver's FIFO, then into place) behind a
// host round trip per chunk; but an open per peer and call unless `send` lies in a registered
// buffer (chorus/registration.hpp). The sizes differ by rank, so the automatic choice first
// agrees on the largest send buffer in a round of words (choose_alltoallv below): zero_copy
// above one_shot's slot, as the other collectives switch, pairwise's messages below.
// Where a rank's `send` cannot be exposed (memory its device cannot export), every rank learns
// it in round 1 and pairwise runs instead. A receiver that finds a peer's block of another
// size than it expects copies nothing and says so in round 2's word (it may not leave before:
// its peers still read its `send`); every rank then fails alike, naming the sender.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <chorus/algorithm/detail/alltoallv_layout.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/pairwise_alltoallv.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/error.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

// Round 2's word of a receiver that found a peer's block of another size than it expects: a
// head no collective's shape has, the sender and the bytes expected (pack_word).
inline constexpr std::uint8_t wrong_block_marker = 0xff;

template <exposing_transport Transport, class T>
void zero_copy_alltoallv_exchange(Transport& tp, std::span<T const> send, std::span<T> recv, alltoallv_layout const& l) {
    using space = typename Transport::memory_space;
    rank_t const me = tp.rank(), p = tp.size();
    // The shape carries no size: every rank's differ (a rank that calls another collective, or
    // another algorithm of this one, is still told apart).
    direct_rounds round(tp, collective_kind::alltoallv, 0);
    direct_pieces parts(static_cast<std::size_t>(p));
    for (rank_t j = 0; j < p; ++j) parts[static_cast<std::size_t>(j)] = bytes_of(alltoallv_block(send, l.send_counts, l.send_displs, j));
    if (!round.expose(bytes_of(send), parts.all())) return alltoallv_exchange(tp, send, recv, l);
    std::uint64_t verdict = 0;
    for (rank_t q = 0; q < p && verdict == 0; ++q) {
        std::size_t const expected = l.recv_counts[static_cast<std::size_t>(q)] * sizeof(T);
        if (q != me && tp.block(q).size() != expected) verdict = pack_word({wrong_block_marker, q, expected});
    }
    for (rank_t q = 0; q < p && verdict == 0; ++q) {
        auto const into = alltoallv_block(recv, l.recv_counts, l.recv_displs, q);
        if (into.empty()) continue;
        copy_part<space>(into, q == me ? alltoallv_block(send, l.send_counts, l.send_displs, me) : direct_block<T>(tp, q),
                         recv.size_bytes());
    }
    round.end(verdict);
    for (rank_t r = 0; r < p; ++r) {  // the first rank's verdict, on every rank
        round_word const w = unpack_word(tp.agreed(r));
        if (w.head != wrong_block_marker) continue;
        rank_t const sender = w.rank;
        std::string const what = "rank " + std::to_string(me) + ": rank " + std::to_string(r) + " expects " +
                                 std::to_string(w.bytes) + " bytes from rank " + std::to_string(sender) +
                                 ", which sends another size (alltoallv: send_counts and recv_counts must agree)";
        tp.abort(what.c_str());
        throw transport_error(errc::size_mismatch, sender, what);
    }
}

/// The automatic choice of alltoallv. Over an exposing_transport the ranks first agree on the
/// largest send buffer of any (a round of words; its block sizes differ by rank): zero_copy
/// above one_shot's slot, where the other collectives switch, or the opens per call would cost
/// more than the copies they save; pairwise's messages below, and over other transports.
template <class T, class Transport>
choice choose_alltoallv(Transport& tp, std::size_t send_bytes) {
    if constexpr (exposing_transport<Transport>) {
        if (direct_aligned<T>() && tp.size() > 1 && exposes_now(tp)) {
            tp.exchange({}, send_bytes, begin_collective(tp, collective_kind::alltoallv));
            std::uint64_t largest = 0;
            for (rank_t r = 0; r < tp.size(); ++r) largest = std::max(largest, tp.agreed(r));
            if (largest > tp.direct_bytes()) return {zero_copy::name, "ranks read each other's buffers where they lie"};
            return {pairwise::name, "every send buffer fits one_shot's slot: no open per call"};
        }
    }
    return {pairwise::name, "pairwise rounds in flight"};
}

} // namespace detail

/// Variable-size alltoall with packed blocks (pairwise_alltoallv's contract), each block read
/// where it lies.
template <exposing_transport Transport, class T, count_range SendCounts, count_range RecvCounts>
void zero_copy_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, std::span<T> recv,
                         RecvCounts const& recv_counts) {
    detail::zero_copy_alltoallv_exchange(tp, send, recv,
                                         detail::packed_alltoallv_layout(tp, send.size(), send_counts, recv.size(), recv_counts));
}

/// Variable-size alltoall with explicit displacements (element offsets of each block); receive
/// blocks must not overlap.
template <exposing_transport Transport, class T, count_range SendCounts, count_range SendDispls, count_range RecvCounts,
          count_range RecvDispls>
void zero_copy_alltoallv(Transport& tp, std::span<T const> send, SendCounts const& send_counts, SendDispls const& send_displs,
                         std::span<T> recv, RecvCounts const& recv_counts, RecvDispls const& recv_displs) {
    detail::zero_copy_alltoallv_exchange(tp, send, recv,
                                         detail::placed_alltoallv_layout(tp, send.size(), send_counts, send_displs, recv.size(),
                                                                         recv_counts, recv_displs));
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::alltoallv, zero_copy> = [](auto&... a) { zero_copy_alltoallv(a...); };
}

} // namespace chorus
