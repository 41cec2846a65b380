// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// A collective's shape (kind, root, bytes) as one word, which the one_shot collectives publish
// with their blocks (transport/concepts.hpp, direct_transport: `agreed`), and the check that
// every rank of a round published the same. Here rather than in direct.hpp because every
// collective may have to check a round: the one a rooted broadcast left (begin_collective).

#include <cstddef>
#include <cstdint>
#include <string>

#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail {

// The agreed word of a round: a head (8 bits), a rank + 1 (16 bits; -1 for none) and a
// number of bytes (40 bits).
struct round_word {
    std::uint8_t head;
    rank_t rank;
    std::uint64_t bytes;
};
constexpr std::uint64_t pack_word(round_word w) noexcept {
    return std::uint64_t{w.head} << 56 | (static_cast<std::uint64_t>(w.rank + 1) & 0xffff) << 40 | (w.bytes & 0xffffffffff);
}
constexpr round_word unpack_word(std::uint64_t w) noexcept {
    return {static_cast<std::uint8_t>(w >> 56), static_cast<rank_t>((w >> 40) & 0xffff) - 1, w & 0xffffffffff};
}

// A one_shot collective's shape: its kind, root and bytes.
constexpr std::uint64_t direct_shape(collective_kind kind, std::size_t bytes, rank_t root) noexcept {
    return pack_word({static_cast<std::uint8_t>(kind), root, static_cast<std::uint64_t>(bytes)});
}

inline std::string describe_shape(std::uint64_t shape) {
    round_word const w = unpack_word(shape);
    auto const kind = static_cast<collective_kind>(w.head);
    if (kind == collective_kind::deregister_buffer)  // the registration's number in place of bytes
        return std::string(kind_name(kind)) + " of registration " + std::to_string(w.bytes);
    if (kind == collective_kind::alltoallv) return std::string(kind_name(kind));  // sizes differ by rank
    return std::string(kind_name(kind)) + " with " + std::to_string(w.bytes) + " bytes" +
           (w.rank >= 0 ? ", root " + std::to_string(w.rank) : std::string());
}

// The number errors give rank r of `tp`: over a sub-group its parent's (group.hpp), as the
// transport's own errors do.
template <class Transport>
rank_t named_rank(Transport const& tp, rank_t r) noexcept {
    if constexpr (requires { tp.parent_rank(r); }) return tp.parent_rank(r);
    else return r;
}

/// Fails the group and throws where some rank's word of the latest round (tp.agreed(r), every
/// rank's readable) differs from rank 0's. Every rank compares with rank 0's, so every rank
/// names the same rank and says the same, as a message of the wrong size or collective would.
template <class Transport>
void check_round_shapes(Transport& tp) {
    std::uint64_t const first = tp.agreed(0);
    for (rank_t r = 1; r < tp.size(); ++r) {
        std::uint64_t const theirs = tp.agreed(r);
        if (theirs == first) continue;
        round_word const t = unpack_word(theirs), f = unpack_word(first);
        bool const other_collective = t.head != f.head;
        bool const other_root = t.rank != f.rank;
        std::string const what = "rank " + std::to_string(named_rank(tp, tp.rank())) + ": rank " + std::to_string(named_rank(tp, r)) +
                                 " called " + describe_shape(theirs) + ", rank " + std::to_string(named_rank(tp, 0)) + " " +
                                 describe_shape(first) + ": " +
                                 (other_collective ? "the ranks called different collectives"
                                  : other_root     ? "their roots differ"
                                  : t.head == static_cast<std::uint8_t>(collective_kind::deregister_buffer)
                                      ? "they end different registrations"
                                      : "their sizes differ");
        tp.abort(what.c_str());
        throw transport_error(other_collective ? errc::tag_mismatch : errc::size_mismatch, named_rank(tp, r), what);
    }
}

} // namespace chorus::detail
