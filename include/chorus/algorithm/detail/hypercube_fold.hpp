// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The non-power-of-two fold shared by recursive doubling and Rabenseifner (MPICH's scheme):
// before the core phase each folded rank hands its vector to its odd partner, which
// combines "lower rank first"; after it, the partner hands the result back.
// Cost: 2 * (alpha + n * beta) + n * gamma extra on the 2e ranks of the fold, none elsewhere.

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/topology/hypercube.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

/// Returns whether this rank takes part in the core phase. `scratch` holds >= data.size().
template <transport Transport, class T, class Op>
bool fold_in(Transport& tp, tag_t tag, hypercube const& cube, std::span<T> data, std::span<T> scratch, Op const& op) {
    rank_t const me = tp.rank();
    rank_t const partner = cube.fold_partner(me);
    if (cube.is_folded(me)) {
        send(tp, tag, partner, as_const(data));
        return false;
    }
    if (partner >= 0) {
        auto const in = scratch.first(data.size());
        recv(tp, tag, partner, in);
        Transport::memory_space::reduce(data, as_const(in), op, /*in_first=*/true);  // partner = me - 1
    }
    return true;
}

template <transport Transport, class T>
void fold_out(Transport& tp, tag_t tag, hypercube const& cube, std::span<T> data) {
    rank_t const me = tp.rank();
    rank_t const partner = cube.fold_partner(me);
    if (cube.is_folded(me)) recv(tp, tag, partner, data);
    else if (partner >= 0) send(tp, tag, partner, as_const(data));
}

/// The frame of the hypercube allreduces: the collective's tag, the fold in, `core(tag, cube,
/// inbox)` on the core ranks (`inbox`: scratch of data.size() elements), the fold out.
template <transport Transport, class T, class Op, class Core>
void hypercube_allreduce(Transport& tp, std::span<T> data, Op const& op, Core const& core) {
    tag_t const tag = begin_collective(tp, collective_kind::allreduce);
    hypercube const cube(tp.size());
    typename Transport::memory_space::template buffer<T> inbox(tp.size() > 1 ? data.size() : 0);
    if (fold_in(tp, tag, cube, data, inbox.span(), op)) core(tag, cube, inbox.span());
    fold_out(tp, tag, cube, data);  // a folded rank receives the result here
}

} // namespace chorus::detail
