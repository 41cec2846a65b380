// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Tree reduce over the binomial tree.
// Schedule: a rank combines its own vector with each child's partial result, children in
// subtree order, then sends the partial to its parent. With the tree rooted at 0 the
// subtrees of a rank's children are consecutive rank intervals after the rank itself, so
// "own, then children in order" reduces in rank order: correct for non-commutative ops.
// A commutative op uses the tree rooted at `root`; a non-commutative op reduces to rank 0
// and rank 0 forwards the result to `root` (one extra message).
// Cost: ceil(log2 p) * (alpha + n * beta + n * gamma) on the critical path.

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/topology/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
/// Reduces `own` over `tree`; the tree's root ends with the result in `acc`. `acc` (n
/// elements) is where a rank with children accumulates; it may alias `own`, in which case
/// `own` is overwritten. A leaf ignores `acc`.
template <transport Transport, tree_topology Tree, class T, class Op>
void tree_reduce_steps(Transport& tp, tag_t tag, Tree const& tree, std::span<T const> own, std::span<T> acc,
                       Op const& op) {
    using space = typename Transport::memory_space;
    rank_t const me = tp.rank();
    auto const parents = tree.parents(me);
    auto const children = tree.children(me);
    if (children.empty()) {  // a leaf, or the only rank (in place or not: nothing to send)
        if (!parents.empty()) send(tp, tag, parents[0], own);
        else if (acc.data() != own.data()) space::copy(acc, own);
        return;
    }
    if (acc.data() != own.data()) space::copy(acc, own);
    typename space::template buffer<T> inbox(acc.size());
    for (rank_t child : children) {
        recv(tp, tag, child, inbox.span());
        space::reduce(acc, as_const(inbox.span()), op, /*in_first=*/false);
    }
    if (!parents.empty()) send(tp, tag, parents[0], as_const(acc));
}
} // namespace detail

/// Reduces every rank's `send` element-wise with `op`; the result lands in `recv` at `root`
/// (`recv` is ignored elsewhere and may be empty there).
/// Collective: every rank passes the same root, the same send.size() and an equivalent op.
/// @throws chorus::invalid_argument for a bad root or recv.size() != send.size() at the root.
template <transport Transport, class T, reduce_op<T> Op>
void tree_reduce(Transport& tp, std::span<T const> send, std::span<T> recv, Op op, rank_t root) {
    detail::check_root(tp, root, "reduce");
    rank_t const me = tp.rank();
    if (me == root)
        detail::check_size(tp, recv.size() == send.size(), "reduce",
                           "the root's receive buffer holds " + std::to_string(recv.size()) +
                               " elements, the send buffer " + std::to_string(send.size()));
    tag_t const tag = detail::begin_collective(tp, detail::collective_kind::reduce);
    using space = typename Transport::memory_space;
    rank_t const p = tp.size();
    // Only the root (or rank 0 for a relayed result) and inner ranks need an accumulator.
    bool const relay = !is_commutative_v<Op, T> && root != 0;
    binomial_tree const tree(p, relay ? 0 : root);
    typename space::template buffer<T> scratch;
    std::span<T> acc = recv;
    if (me != root && !tree.children(me).empty()) {
        scratch = typename space::template buffer<T>(send.size());
        acc = scratch.span();
    }
    detail::tree_reduce_steps(tp, tag, tree, send, acc, op);
    if (relay) {
        if (me == 0) detail::send(tp, tag, root, detail::as_const(acc));
        else if (me == root) detail::recv(tp, tag, 0, recv);
    }
    if (me == root) space::finalize(recv, op, p);
}

/// In-place form: `data` is every rank's contribution and, at `root`, the result. Other
/// ranks' `data` is left unchanged.
template <transport Transport, class T, reduce_op<T> Op>
void tree_reduce(Transport& tp, std::span<T> data, Op op, rank_t root) {
    tree_reduce(tp, detail::as_const(data), tp.rank() == root ? data : std::span<T>(), op, root);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce, tree> = [](auto&... a) { tree_reduce(a...); };
}

} // namespace chorus
