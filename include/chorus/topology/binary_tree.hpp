// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <chorus/topology/rank_list.hpp>
#include <chorus/topology/rooted_tree_base.hpp>

namespace chorus {

/// The complete binary tree over `size` ranks rooted at `root`, laid out as a heap in virtual
/// ranks v = r - root (mod p): parent (v-1)/2, children 2v+1 and 2v+2. Depth floor(log2 p);
/// every rank forwards to at most two children, which suits pipelined (segmented) schedules.
class binary_tree : public detail::rooted_tree_base {
public:
    constexpr binary_tree(rank_t size, rank_t root = 0) noexcept : rooted_tree_base(size, root) {}

    constexpr rank_list parents(rank_t r) const noexcept {
        rank_list out;
        rank_t const v = virtual_rank(r);
        if (v != 0) out.push_back(real_rank((v - 1) / 2));
        return out;
    }
    constexpr rank_list children(rank_t r) const noexcept {
        rank_list out;
        rank_t const v = virtual_rank(r);
        for (rank_t c = 2 * v + 1; c <= 2 * v + 2; ++c)
            if (c < size_) out.push_back(real_rank(c));
        return out;
    }
    constexpr rank_list neighbours(rank_t r) const noexcept { return neighbours_of(*this, r); }
};

} // namespace chorus
