// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Rabenseifner allreduce: recursive-halving reduce-scatter, then recursive-doubling
// allgather, over the hypercube (with the fold for non-powers of two).
// Schedule: the vector is cut into q blocks. Halving step s = 0 .. log2 q - 1 pairs core
// ranks differing in bit s; each keeps one half of its current block range (the lower half
// if its bit s is 0), sends the other half and reduces the partner's copy of the kept half
// into its own, "lower rank first". Distances ascend (1, 2, 4, ...), so every partial covers
// consecutive core ranks and rank order is kept: correct for non-commutative ops. After the
// halving each core rank owns one fully reduced block; the doubling steps run in reverse,
// exchanging owned ranges until every rank holds the whole vector.
// Cost: 2 log2 q * alpha + 2 (q-1)/q * n * beta + (q-1)/q * n * gamma, plus the fold's
// 2 * (alpha + n * beta). Bandwidth-optimal like the ring but with log p latency terms:
// the choice for mid-sized vectors.

#include <array>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/hypercube_fold.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/hypercube.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <transport Transport, class T, reduce_op<T> Op>
void rabenseifner_allreduce(Transport& tp, std::span<T> data, Op op) {
    using space = typename Transport::memory_space;
    rank_t const me = tp.rank();
    detail::hypercube_allreduce(tp, data, op, [&](tag_t tag, hypercube const& cube, std::span<T> inbox) {
        auto const q = static_cast<std::size_t>(cube.core_size());
        rank_t const core = cube.core_rank(me);
        // Block ranges [lo, hi) before each halving step, to retrace them when doubling.
        std::array<std::size_t, 32> saved_lo{}, saved_hi{};
        std::size_t lo = 0, hi = q;
        for (int step = 0; step < cube.dimension(); ++step) {
            rank_t const partner = cube.partner(me, step);
            std::size_t const mid = (lo + hi) / 2;
            bool const keep_low = (core & (rank_t{1} << step)) == 0;
            saved_lo[static_cast<std::size_t>(step)] = lo;
            saved_hi[static_cast<std::size_t>(step)] = hi;
            auto const give = keep_low ? detail::blocks(data, mid, hi, q) : detail::blocks(data, lo, mid, q);
            if (keep_low) hi = mid;
            else lo = mid;
            auto const keep = detail::blocks(data, lo, hi, q);
            auto const in = inbox.first(keep.size());
            detail::sendrecv(tp, tag, partner, detail::as_const(give), partner, in);
            space::reduce(keep, detail::as_const(in), op, /*in_first=*/partner < me);
        }
        // This rank's block [lo, hi) is fully reduced; finalize it before it travels.
        space::finalize(detail::blocks(data, lo, hi, q), op, tp.size());
        for (int step = cube.dimension() - 1; step >= 0; --step) {
            rank_t const partner = cube.partner(me, step);
            std::size_t const outer_lo = saved_lo[static_cast<std::size_t>(step)];
            std::size_t const outer_hi = saved_hi[static_cast<std::size_t>(step)];
            // The partner owns the other half of [outer_lo, outer_hi).
            std::size_t const other_lo = lo == outer_lo ? hi : outer_lo;
            std::size_t const other_hi = lo == outer_lo ? outer_hi : lo;
            detail::sendrecv(tp, tag, partner, detail::as_const(detail::blocks(data, lo, hi, q)), partner,
                             detail::blocks(data, other_lo, other_hi, q));
            lo = outer_lo;
            hi = outer_hi;
        }
    });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, rabenseifner> =
    [](auto&... a) { rabenseifner_allreduce(a...); };
}

} // namespace chorus
