// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Zero-copy broadcast over an exposing_transport (ranks that read each other's buffers where
// they lie: CUDA IPC; shm_transport, in registered shm_buffers).
// Schedule: two rounds, no message.
//   1. The root exposes its vector (the others an empty block); every other rank copies it
//      into its own, all of them at once.
//   2. An empty round of every rank: the root does not return, and let its caller write or
//      free the vector, while a peer may still read it (each closes the root's allocation once
//      its read completed, before it announces this round).
// Cost: 2 delta + n * beta, every rank reading at once: (p - 1) n bytes out of the root's
// memory, each once, where the tree sends the vector ceil(log2 p) times along its critical
// path and copies every chunk twice (into the receiver's FIFO, then into place).
// Over a putting_transport (shm_transport), in round 1 a rank whose output can be exposed
// exposes it too, and the root, idle otherwise, writes the last 1/p of the vector (from a page
// boundary) into each such output while its rank copies the rest: (p - 1) n / p bytes each, on
// p cores instead of p - 1 (2 ranks: half the time where a core copies at memory speed). Round
// 2 then also keeps a receiver from returning before the root's writes into its output are
// done. After a failure (a rank that died) a receiver can throw while the root still writes.
// Where the root's vector cannot be exposed (memory its device cannot export), every rank
// learns it in round 1 and the schedule of messages runs instead (tree, or scatter_allgather
// for large vectors on many ranks: detail/select.hpp).

#include <cstddef>
#include <cstdint>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/algorithm/scatter_allgather_broadcast.hpp>
#include <chorus/algorithm/tree_broadcast.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
/// Where the root's share of an offered output of `bytes` at `at` starts (in bytes): its last
/// 1/p or a little more, from a page boundary, so that no page is written by two ranks. The root
/// computes it from put_block's address, the receiver from its own: the same within a page. All
/// of it (the root writes nothing) where no page boundary falls in the output's first
/// (p - 1) / p.
inline std::size_t root_share_at(void const* at, std::size_t bytes, rank_t p) noexcept {
    constexpr std::uintptr_t page = 4096;
    auto const begin = reinterpret_cast<std::uintptr_t>(at);
    std::uintptr_t const split = (begin + bytes - bytes / static_cast<std::size_t>(p)) / page * page;
    return split <= begin ? bytes : static_cast<std::size_t>(split - begin);
}
} // namespace detail

/// Copies `data` from `root` to every rank, in place.
template <exposing_transport Transport, class T>
void zero_copy_broadcast(Transport& tp, std::span<T> data, rank_t root) {
    detail::check_root(tp, root, "broadcast");
    rank_t const me = tp.rank();
    detail::direct_rounds round(tp, detail::collective_kind::broadcast, data.size_bytes(), root);
    auto const mine = detail::bytes_of(std::span<T const>(data));
    // The root's block is read; another rank exposes its own only where the root may write
    // into it (and it can be exposed: a rank asks itself, so its offer never makes the round
    // fall back). The others expose nothing: their memory need not be exportable.
    bool const offered = [&] {
        if constexpr (putting_transport<Transport>) return me != root && !data.empty() && tp.exposable(mine);
        else return false;
    }();
    if (!round.expose(me == root || offered ? mine : std::span<std::byte const>())) {
        if (detail::choose_broadcast(tp.size(), data.size_bytes()).algorithm == scatter_allgather::name)
            return scatter_allgather_broadcast(tp, data, root);
        return tree_broadcast(tp, data, root);
    }
    if constexpr (putting_transport<Transport>) {
        if (me == root) {
            for (rank_t r = 0; r < tp.size(); ++r) {
                std::span<std::byte> const theirs = r == root ? std::span<std::byte>() : tp.put_block(r);
                if (theirs.empty()) continue;
                std::size_t const at = detail::root_share_at(theirs.data(), theirs.size(), tp.size());
                detail::copy_part<typename Transport::memory_space>(theirs.subspan(at), mine.subspan(at), mine.size());
            }
        }
    }
    if (me != root) {
        auto const from = detail::direct_block<T>(tp, root);
        if (!offered) {
            Transport::memory_space::copy(data, from);
        } else {
            std::size_t const at = detail::root_share_at(data.data(), data.size_bytes(), tp.size());
            std::span<std::byte> const into(reinterpret_cast<std::byte*>(data.data()), at);
            detail::copy_part<typename Transport::memory_space>(into, detail::bytes_of(from).first(at), mine.size());
        }
    }
    round.end();
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::broadcast, zero_copy> = [](auto&... a) { zero_copy_broadcast(a...); };
}

} // namespace chorus
