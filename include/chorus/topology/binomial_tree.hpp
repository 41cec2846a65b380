// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <chorus/topology/rank_list.hpp>
#include <chorus/topology/rooted_tree_base.hpp>

namespace chorus {

/// The binomial tree over `size` ranks rooted at `root`, in virtual ranks v = r - root (mod p):
/// the parent of v > 0 is v with its lowest set bit cleared; the children of v are v + 2^k
/// for every 2^k below v's lowest set bit (every 2^k for the root) that is still < p.
/// Depth ceil(log2 p): a broadcast or reduce over it takes that many rounds.
/// Children are listed by increasing k, so with root 0 the subtrees of v's children cover the
/// consecutive intervals [v+1, v+2), [v+2, v+4), ... after v itself: combining own value,
/// then each child's result in list order, reduces in rank order.
class binomial_tree : public detail::rooted_tree_base {
public:
    constexpr binomial_tree(rank_t size, rank_t root = 0) noexcept : rooted_tree_base(size, root) {}

    constexpr rank_list parents(rank_t r) const noexcept {
        rank_list out;
        rank_t const v = virtual_rank(r);
        if (v != 0) out.push_back(real_rank(v & (v - 1)));
        return out;
    }
    constexpr rank_list children(rank_t r) const noexcept {
        rank_list out;
        rank_t const v = virtual_rank(r);
        // v's lowest set bit bounds its children; the root (v = 0) has no bound but p.
        for (rank_t bit = 1; bit < size_ && (v == 0 || bit < (v & -v)); bit <<= 1)
            if (v + bit < size_) out.push_back(real_rank(v + bit));
        return out;
    }
    constexpr rank_list neighbours(rank_t r) const noexcept { return neighbours_of(*this, r); }
    /// Number of ranks in the subtree of r (r included): [v, v + subtree_size) in virtual ranks.
    constexpr rank_t subtree_size(rank_t r) const noexcept {
        rank_t const v = virtual_rank(r);
        if (v == 0) return size_;
        rank_t const low_bit = v & -v;
        return low_bit < size_ - v ? low_bit : size_ - v;
    }
};

} // namespace chorus
