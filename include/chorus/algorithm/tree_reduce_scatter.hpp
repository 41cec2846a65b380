// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Tree reduce-scatter: binomial reduce of the whole p*n vector to rank 0 (in rank order,
// see tree_reduce), then a linear scatter of the blocks from rank 0.
// Cost: ceil(log2 p) * (alpha + p n beta + p n gamma) + (p - 1) * (alpha + n beta). It moves
// far more bytes than the ring, but keeps rank order: the schedule for non-commutative ops.

#include <span>
#include <vector>

#include <chorus/algorithm/tree_reduce.hpp>
#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

/// The tree's steps, shared with tree_reduce_scatterv: the whole of `send` reduced to rank 0,
/// which sends block r (`block(acc, r)`, a span of the reduced vector) to rank r.
template <transport Transport, class T, class Op, class Block>
void tree_reduce_scatter_steps(Transport& tp, tag_t tag, std::span<T const> send, std::span<T> recv, Op const& op,
                               Block const& block) {
    rank_t const p = tp.size(), me = tp.rank();
    using space = typename Transport::memory_space;
    binomial_tree const tree(p, 0);
    typename space::template buffer<T> acc(tree.children(me).empty() && me != 0 ? 0 : send.size());
    tree_reduce_steps(tp, tag, tree, send, acc.span(), op);
    if (me != 0) {
        detail::recv(tp, tag, 0, recv);
    } else {
        std::vector<typename Transport::request> sends;
        sends.reserve(static_cast<std::size_t>(p));
        for (rank_t r = 1; r < p; ++r) sends.push_back(tp.isend(r, tag, bytes_of(as_const(block(acc.span(), r)))));
        space::copy(recv, as_const(block(acc.span(), 0)));
        for (auto& s : sends) s.wait();
    }
    space::finalize(recv, op, p);
}

} // namespace detail

/// Reduces every rank's `send` (p blocks of recv.size() elements) element-wise with `op`;
/// rank r receives the reduction of block r in `recv`.
/// @throws chorus::invalid_argument when send.size() != p * recv.size().
template <transport Transport, class T, reduce_op<T> Op>
void tree_reduce_scatter(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    std::size_t const n = recv.size();
    tag_t const tag =
        detail::begin_blocks(tp, detail::collective_kind::reduce_scatter, "the send buffer", send.size(), "recv.size()", n);
    detail::tree_reduce_scatter_steps(tp, tag, send, recv, op,
                                      [n](std::span<T> acc, rank_t r) { return detail::slot(acc, r, n); });
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::reduce_scatter, tree> =
    [](auto&... a) { tree_reduce_scatter(a...); };
}

} // namespace chorus
