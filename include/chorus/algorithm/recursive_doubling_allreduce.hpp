// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Recursive-doubling allreduce over the hypercube.
// Schedule: fold the first 2e ranks (e = p - q, q the largest power of two <= p) into q
// core ranks; in core step s every core rank exchanges its whole vector with the core rank
// whose index differs in bit s and combines "lower rank first"; then unfold. After step s a
// core rank holds the reduction over the 2^(s+1) consecutive core ranks of its group.
// Cost: log2 q * (alpha + n * beta + n * gamma), plus 2 * (alpha + n * beta) where p is not
// a power of two. Latency-optimal for small n. Because every rank combines the same
// operands in the same order, results agree bit for bit across ranks and the rank order is
// kept: correct for non-commutative ops.

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
void recursive_doubling_allreduce(Transport& tp, std::span<T> data, Op op) {
    using space = typename Transport::memory_space;
    rank_t const me = tp.rank();
    detail::hypercube_allreduce(tp, data, op, [&](tag_t tag, hypercube const& cube, std::span<T> inbox) {
        for (int step = 0; step < cube.dimension(); ++step) {
            rank_t const partner = cube.partner(me, step);
            detail::sendrecv(tp, tag, partner, detail::as_const(data), partner, inbox);
            space::reduce(data, detail::as_const(inbox), op, /*in_first=*/partner < me);
        }
    });
    space::finalize(data, op, tp.size());
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, recursive_doubling> =
    [](auto&... a) { recursive_doubling_allreduce(a...); };
}

} // namespace chorus
