// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Ring allreduce = ring reduce-scatter + ring allgather (the seed's 2.4 and section 3).
// Schedule: the vector is cut into p near-equal blocks. Reduce-scatter: in step
// s = 0 .. p-2 rank r sends block (r - s) to its right neighbour and reduces the block
// (r - s - 1) arriving from its left neighbour into its own copy; after step s that block
// holds s + 2 contributions, so after p - 1 steps rank r owns the full reduction of block
// r + 1. Allgather: p - 1 more steps pass the reduced blocks around the ring.
// Cost: 2 (p-1) * alpha + 2 (p-1)/p * n * beta + (p-1)/p * n * gamma: each rank moves
// 2(p-1)/p of the vector, which tends to 2n however large p grows (bandwidth-optimal), at a
// latency linear in p. Contributions to a block are combined starting at different ranks,
// so the op must be commutative; every block is reduced once and copied, so all ranks end
// with identical bits.

#include <span>

#include <chorus/detail/collective.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with the commutative `op`, in place.
/// Collective: every rank passes the same data.size() and an equivalent op.
template <transport Transport, class T, reduce_op<T> Op>
void ring_allreduce(Transport& tp, std::span<T> data, Op op) {
    static_assert(is_commutative_v<Op, T>,
                  "ring_allreduce combines contributions in ring order, which needs a commutative op: "
                  "wrap a commutative function in chorus::commutative(f), or use tree_allreduce, "
                  "recursive_doubling_allreduce or rabenseifner_allreduce, which keep rank order");
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::allreduce);
    using space = typename Transport::memory_space;
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const parts = static_cast<std::size_t>(p);
    auto const block = [&](rank_t i) { return detail::block(data, detail::ring_index(i, p), parts); };
    ring_topology const ring(p);
    // The last block is the largest (block 0 the smallest), so it sizes the inbox.
    typename space::template buffer<T> inbox(p > 1 ? block(p - 1).size() : 0);
    for (rank_t step = 0; step + 1 < p; ++step) {
        auto const acc = block(me - step - 1);
        auto const in = inbox.span().first(acc.size());
        detail::sendrecv(tp, tag, ring.right(me), detail::as_const(block(me - step)), ring.left(me), in);
        space::reduce(acc, detail::as_const(in), op, /*in_first=*/true);
    }
    space::finalize(block(me + 1), op, p);
    for (rank_t step = 0; step + 1 < p; ++step)
        detail::sendrecv(tp, tag, ring.right(me), detail::as_const(block(me + 1 - step)), ring.left(me),
                         block(me - step));
}

} // namespace chorus
