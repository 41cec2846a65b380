// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// What the one_shot collectives share (transport/concepts.hpp, direct_transport): the one
// round that publishes this rank's block with the collective's shape, the check that every
// rank called the collective alike, and typed views of the blocks.
//
// The shape (kind, root, bytes) travels with the block, so every rank sees every rank's: a
// rank that called the collective differently is named by all of them, in the same words,
// without another message. Ranks whose sizes fall on either side of the one_shot limit (one
// exchanges, the other sends messages) are told apart by the transport (shm/engine.hpp).

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/shape.hpp>
#include <chorus/detail/elementwise.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/signals.hpp>

namespace chorus::detail {

// one_shot combines in rank order (any op) over a direct_transport only.
template <collective_kind K, class T, class Op>
inline constexpr bool schedule_applies<K, one_shot, T, Op> = direct_aligned<T>();
template <class Transport>
inline constexpr bool schedule_serves<one_shot, Transport> = direct_transport<Transport>;
// zero_copy reads the caller's buffers where they lie, over an exposing_transport only.
template <collective_kind K, class T, class Op>
inline constexpr bool schedule_applies<K, zero_copy, T, Op> = direct_aligned<T>();
template <class Transport>
inline constexpr bool schedule_serves<zero_copy, Transport> = exposing_transport<Transport>;

/// The rounds of one one_shot collective: one tag and one shape (kind, root, the bytes every
/// rank must agree on) for all; each round publishes this rank's block, at most the
/// transport's direct_bytes, and returns once every rank's is readable (direct_block).
template <direct_transport Transport>
class direct_rounds {
public:
    direct_rounds(Transport& tp, collective_kind kind, std::size_t bytes, rank_t root = -1)
        : tp_(tp), shape_(direct_shape(kind, bytes, root)), tag_(begin_collective(tp, kind)), empty_(bytes == 0) {}

    /// Elements of `unit` bytes that fit a round `per_unit` times (alltoall: p blocks of one
    /// element each); at least 1 (a collective without elements takes its one round empty),
    /// or the collective fails on every rank.
    std::size_t per_round(std::size_t unit, std::size_t per_unit = 1) const {
        std::size_t const n = tp_.direct_bytes() / (unit * per_unit);
        if (n == 0 && empty_) return 1;
        if (n == 0)
            fail_argument(tp_, describe_shape(shape_) + ": one_shot needs " + std::to_string(unit * per_unit) +
                                   " bytes in a round, more than this transport's direct_bytes (" + std::to_string(tp_.direct_bytes()) +
                                   ": CHORUS_SHM_DIRECT_BYTES, CHORUS_CUDA_DIRECT_BYTES)");
        return n;
    }

    void operator()(std::span<std::span<std::byte const> const> pieces) {
        tp_.exchange(pieces, shape_, tag_);
        check_shapes();
    }
    void operator()(std::span<std::byte const> block) { (*this)(std::span<std::span<std::byte const> const>(&block, 1)); }

    /// A round in which only `root`'s block is read: over a rooted_transport the root returns
    /// once its block is published and the others once the root's is readable (each compares
    /// its shape with the root's; where they differ, it waits for every rank's and names the
    /// same rank as every other rank would); elsewhere a round of every rank's.
    void from(std::span<std::byte const> block, rank_t root) {
        if constexpr (rooted_transport<Transport>) {
            tp_.exchange(std::span<std::span<std::byte const> const>(&block, 1), shape_, tag_, root);
            if (tp_.rank() == root || tp_.agreed(root) == shape_) return;
            tp_.await_round();
            check_shapes();
        } else {
            (*this)(block);
        }
    }

    /// A round whose block is `buffer` itself, where it lies (exposing_transport): whether every
    /// rank's could be exposed (every rank gets the same answer).
    bool expose(std::span<std::byte const> buffer)
        requires exposing_transport<Transport>
    {
        bool const all = tp_.expose(buffer, shape_, tag_);
        check_shapes();
        return all;
    }
    /// The same, where rank r reads `parts[r]` of `buffer` only (tp.block(r) is then, on rank r,
    /// this rank's part for it).
    bool expose(std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts)
        requires exposing_transport<Transport>
    {
        bool const all = tp_.expose(buffer, parts, shape_, tag_);
        check_shapes();
        return all;
    }

    /// The last round of a collective that exposed buffers, empty: once it returned, no peer
    /// reads them any more. `verdict` (0: none, the shape goes) replaces this rank's agreed
    /// word of the round, which every rank reads with tp.agreed(r) once it returned: what a
    /// rank found wrong while the others read its buffer, told once none reads it any more.
    void end(std::uint64_t verdict = 0) { tp_.exchange({}, verdict == 0 ? shape_ : verdict, tag_); }

    /// A round of expose() that registers `buffer` (registering_transport): its number, or 0 on
    /// every rank where some rank's could not be exposed.
    std::uint64_t keep(std::span<std::byte const> buffer)
        requires registering_transport<Transport>
    {
        std::uint64_t const id = tp_.keep(buffer, shape_, tag_);
        check_shapes();
        return id;
    }

    /// The round that ends registration `id` on every rank.
    void release(std::uint64_t id)
        requires registering_transport<Transport>
    {
        tp_.release(id, shape_, tag_);
        check_shapes();
    }

private:
    void check_shapes() {
        if (checked_) return;
        checked_ = true;
        check_round_shapes(tp_);
    }

    Transport& tp_;
    std::uint64_t shape_;
    tag_t tag_;
    bool empty_;
    bool checked_ = false;
};

/// The one_shot collectives' first choice over a signaling_transport: `body` as one signaled
/// launch (transport/signals.hpp) where `bytes` fit signal_bytes() — true — else nothing.
template <class Transport, class Body>
bool launch_signaled(Transport& tp, collective_kind kind, std::size_t bytes, rank_t root, Body const& body) {
    // A body is a kernel argument: one that is not trivially copyable (a user's op that holds
    // more than values) takes the rounds, on every rank alike (a type decides, not a size).
    if constexpr (signaling_transport<Transport> && std::is_trivially_copyable_v<Body>) {
        if (std::size_t const most = tp.signal_bytes(); most > 0 && bytes <= most) {
            tp.launch(body, bytes, direct_shape(kind, bytes, root), &describe_shape);
            return true;
        }
    }
    return false;
}

/// A lane's copy of its share of `from` into `to` (a signaled body's), 16 bytes per load where
/// both line up (detail/elementwise.hpp).
template <class Channel, class T>
CHORUS_HOST_DEVICE void lane_copy(Channel& c, lane_span share, T const* from, T* to) {
    T const* const in = from + share.first;
    fold_elements(to + share.first, [&](unsigned) { return in; }, 1, share.last - share.first, c.thread(), c.threads(), keep_value{},
                  keep_value{}, c);
}

/// A lane's copy of its share of each of the p blocks of `n` elements of `send` into this rank's
/// slot, at the same place (a signaled alltoall's or reduce_scatter's publish).
template <class Channel, class T>
CHORUS_HOST_DEVICE void lane_publish_blocks(Channel& c, lane_span share, T const* send, std::size_t n) {
    T* const own = reinterpret_cast<T*>(c.own());
    for (rank_t j = 0; j < c.size(); ++j) {
        std::size_t const at = static_cast<std::size_t>(j) * n;
        lane_copy(c, share, send + at, own + at);
    }
}

/// A lane's fold of its share of every rank's slot, from element `at` of each, in rank order
/// and the op's finish included, into `out` (a signaled allreduce's or reduce_scatter's), 16
/// bytes per load where the slots and `out` line up.
template <class Channel, class T, class Op>
CHORUS_HOST_DEVICE void lane_fold(Channel& c, lane_span share, std::size_t at, T* out, Op const& op) {
    auto const in = [&](unsigned r) { return reinterpret_cast<T const*>(c.slot(static_cast<rank_t>(r))) + at + share.first; };
    fold_elements(out + share.first, in, static_cast<unsigned>(c.size()), share.last - share.first, c.thread(), c.threads(), op,
                  op_finish<Op>{op, c.size()}, c);
}

/// The rounds that cover `n` elements, `k` per round: at least one (an empty collective still
/// meets, and checks that every rank called it alike).
constexpr std::size_t direct_round_count(std::size_t n, std::size_t k) noexcept { return n == 0 ? 1 : (n + k - 1) / k; }

/// The pieces of one round's block, one per rank (alltoall, reduce_scatter): held inline up to
/// 16 ranks, so that a small collective allocates nothing.
class direct_pieces {
public:
    explicit direct_pieces(std::size_t n) : n_(n) {
        if (n > inline_count) heap_.resize(n);
    }
    std::span<std::byte const>& operator[](std::size_t i) noexcept { return data()[i]; }
    std::span<std::span<std::byte const> const> all() noexcept { return {data(), n_}; }

private:
    static constexpr std::size_t inline_count = 16;
    std::span<std::byte const>* data() noexcept { return n_ > inline_count ? heap_.data() : inline_.data(); }
    std::size_t n_;
    std::array<std::span<std::byte const>, inline_count> inline_{};
    std::vector<std::span<std::byte const>> heap_;
};

/// The rounds of a collective in which every rank publishes the p blocks of n elements of
/// `send` (alltoall, reduce_scatter): each round the next part of every block, then
/// `after(first, len)` with the part's place in a block. A peer's part for rank `me` then
/// starts at element me * len of its round's block.
template <direct_transport Transport, class T, class After>
void direct_block_rounds(Transport& tp, collective_kind kind, std::span<T const> send, std::size_t n, After after) {
    auto const p = static_cast<std::size_t>(tp.size());
    direct_rounds round(tp, kind, send.size_bytes());
    std::size_t const k = round.per_round(sizeof(T), p);
    direct_pieces pieces(p);
    for (std::size_t c = 0, rounds = direct_round_count(n, k); c < rounds; ++c) {
        std::size_t const len = std::min(k, n - c * k);  // of every block, this round
        for (std::size_t r = 0; r < p; ++r) pieces[r] = bytes_of(slot(send, static_cast<rank_t>(r), n).subspan(c * k, len));
        round(pieces.all());
        after(c * k, len);
    }
}

/// Rank r's block of the round as elements of T, from element `first`, `count` of them.
template <class T, direct_transport Transport>
std::span<T const> direct_block(Transport const& tp, rank_t r, std::size_t first, std::size_t count) noexcept {
    return {reinterpret_cast<T const*>(tp.block(r).data()) + first, count};
}
template <class T, direct_transport Transport>
std::span<T const> direct_block(Transport const& tp, rank_t r) noexcept {
    return direct_block<T>(tp, r, 0, tp.block(r).size() / sizeof(T));
}

/// A memory space that folds many operands in one pass (`fold(out, parts, op, p)`: out[i] =
/// parts[0][i] op ... op parts[k-1][i], finished; `out` may be one of them): on a device one
/// kernel reads every peer's block, where pairwise steps would launch p - 1 kernels and write
/// `out` as often.
template <class Space, class T, class Op>
concept folding_space = requires(std::span<T> out, std::span<T const* const> parts, Op const& op, rank_t p) {
    { Space::max_fold } -> std::convertible_to<std::size_t>;
    Space::fold(out, parts, op, p);
};

/// Whether `Space` folds the blocks of p ranks in one pass (folding_space, p within its limit).
template <class Space, class T, class Op>
constexpr bool folds_in_one_pass(rank_t p) noexcept {
    if constexpr (folding_space<Space, T, Op>) return p >= 2 && static_cast<std::size_t>(p) <= Space::max_fold;
    else return false;
}

/// out = block 0 op block 1 op ... op block p-1 (elements `first` .. `first + out.size()` of
/// each), in rank order, then the op's finish (AVG's division). This rank's part is read from
/// `own` rather than from its published copy (a copy less to pull through the cache), unless
/// `own` is `out` and the first step would have overwritten it (ranks 2 and up).
template <class Transport, class T, class Op>
void direct_fold(Transport const& tp, std::span<T const> own, std::span<T> out, std::size_t first, Op const& op) {
    using space = typename Transport::memory_space;
    rank_t const p = tp.size();
    if constexpr (folding_space<space, T, Op>) {
        if (folds_in_one_pass<space, T, Op>(p)) {
            // One pass reads every operand of an element before writing it: `own` may be `out`.
            std::array<T const*, space::max_fold> parts{};
            for (rank_t r = 0; r < p; ++r)
                parts[static_cast<std::size_t>(r)] = r == tp.rank() ? own.data() : direct_block<T>(tp, r, first, out.size()).data();
            return space::fold(out, std::span<T const* const>(parts.data(), static_cast<std::size_t>(p)), op, p);
        }
    }
    bool const own_intact = own.data() != out.data() || tp.rank() <= 1;
    auto const part = [&](rank_t r) { return r == tp.rank() && own_intact ? own : direct_block<T>(tp, r, first, out.size()); };
    if (p == 1) {
        if (own.data() != out.data()) space::copy(out, own);
    } else {
        space::reduce(out, part(0), part(1), op);
        for (rank_t r = 2; r < p; ++r) space::reduce(out, part(r), op, /*in_first=*/false);
    }
    space::finalize(out, op, p);
}

} // namespace chorus::detail
