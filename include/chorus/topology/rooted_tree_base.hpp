// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <chorus/topology/rank_list.hpp>

namespace chorus::detail {

/// What the rooted trees share: ranks renumbered so the root is virtual rank 0
/// (v = r - root mod p), and neighbours = parents + children.
class rooted_tree_base {
public:
    constexpr rank_t size() const noexcept { return size_; }
    constexpr rank_t root() const noexcept { return root_; }

protected:
    constexpr rooted_tree_base(rank_t size, rank_t root) noexcept : size_(size), root_(root) {}
    constexpr rank_t virtual_rank(rank_t r) const noexcept { return (r - root_ + size_) % size_; }
    constexpr rank_t real_rank(rank_t v) const noexcept { return (v + root_) % size_; }

    template <class Tree>
    static constexpr rank_list neighbours_of(Tree const& tree, rank_t r) noexcept {
        rank_list out = tree.parents(r);
        for (rank_t c : tree.children(r)) out.push_back(c);
        return out;
    }

    rank_t size_;
    rank_t root_;
};

} // namespace chorus::detail
