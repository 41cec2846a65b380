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

#include <chorus/detail/collective.hpp>
#include <chorus/detail/hypercube_fold.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/hypercube.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <transport Transport, class T, reduce_op<T> Op>
void recursive_doubling_allreduce(Transport& tp, std::span<T> data, Op op) {
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::allreduce);
    using space = typename Transport::memory_space;
    rank_t const me = tp.rank();
    hypercube const cube(tp.size());
    typename space::template buffer<T> inbox(tp.size() > 1 ? data.size() : 0);
    if (detail::fold_in(tp, tag, cube, data, inbox.span(), op)) {
        for (int step = 0; step < cube.dimension(); ++step) {
            rank_t const partner = cube.partner(me, step);
            detail::sendrecv(tp, tag, partner, detail::as_const(data), partner, inbox.span());
            space::reduce(data, detail::as_const(inbox.span()), op, /*in_first=*/partner < me);
        }
    }
    detail::fold_out(tp, tag, cube, data);
    space::finalize(data, op, tp.size());
}

} // namespace chorus
