// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Tree allreduce: binomial reduce to rank 0, then binomial broadcast from rank 0.
// Schedule: as tree_reduce (own vector, then children's partials in subtree order, which is
// rank order) followed by tree_broadcast; every rank accumulates in `data` itself, since the
// broadcast overwrites it anyway.
// Cost: 2 * ceil(log2 p) * (alpha + n * beta) + ceil(log2 p) * n * gamma. Order-preserving,
// so it serves non-commutative ops; every rank receives the root's bits, so results agree
// exactly even for floating point.

#include <span>

#include <chorus/algorithm/tree_broadcast.hpp>
#include <chorus/algorithm/tree_reduce.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// Reduces `data` element-wise over all ranks with `op`, in place, on every rank.
template <transport Transport, class T, reduce_op<T> Op>
void tree_allreduce(Transport& tp, std::span<T> data, Op op) {
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::allreduce);
    binomial_tree const tree(tp.size(), 0);
    detail::tree_reduce_steps(tp, tag, tree, detail::as_const(data), data, op);
    if (tp.rank() == 0) Transport::memory_space::finalize(data, op, tp.size());
    detail::tree_broadcast_steps(tp, tag, tree, data);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::allreduce, tree> = [](auto&... a) { tree_allreduce(a...); };
}

} // namespace chorus
