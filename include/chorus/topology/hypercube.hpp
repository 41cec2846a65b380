// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <chorus/topology/rank_list.hpp>

namespace chorus {

/// The hypercube of recursive doubling and halving, with the fold that makes it work for any
/// rank count. Let q be the largest power of two <= p and e = p - q. The first 2e ranks pair
/// up as (2i, 2i+1): the even rank folds its data into the odd one and sits out the core
/// phase; the odd one joins the core as core rank i. Ranks >= 2e are core ranks r - e. Core
/// ranks are monotone in real rank and each stands for a consecutive interval of real ranks,
/// so combining "lower partner first" keeps rank order for non-commutative operations.
/// In core step s (0 <= s < dimension()), core rank c talks to c ^ 2^s.
class hypercube {
public:
    constexpr explicit hypercube(rank_t size) noexcept : size_(size), core_(1) {
        while (core_ * 2 <= size_) core_ *= 2;
        extra_ = size_ - core_;
        for (rank_t q = core_; q > 1; q >>= 1) ++dimension_;
    }
    constexpr rank_t size() const noexcept { return size_; }
    /// q: the number of ranks in the core (a power of two).
    constexpr rank_t core_size() const noexcept { return core_; }
    /// log2 q: the number of core steps.
    constexpr int dimension() const noexcept { return dimension_; }
    /// Whether r folds into fold_partner(r) and sits out the core phase.
    constexpr bool is_folded(rank_t r) const noexcept { return r < 2 * extra_ && r % 2 == 0; }
    /// The rank r pairs with in the fold (r+1 for a folded rank, r-1 for its partner), or -1.
    constexpr rank_t fold_partner(rank_t r) const noexcept {
        if (r >= 2 * extra_) return -1;
        return r % 2 == 0 ? r + 1 : r - 1;
    }
    /// r's rank in the core, or -1 for a folded rank.
    constexpr rank_t core_rank(rank_t r) const noexcept {
        if (r < 2 * extra_) return r % 2 == 1 ? r / 2 : -1;
        return r - extra_;
    }
    /// The real rank of core rank c.
    constexpr rank_t real_rank(rank_t c) const noexcept { return c < extra_ ? 2 * c + 1 : c + extra_; }
    /// The real rank that core rank of r talks to in core step s.
    constexpr rank_t partner(rank_t r, int step) const noexcept {
        return real_rank(core_rank(r) ^ (rank_t{1} << step));
    }
    constexpr rank_list neighbours(rank_t r) const noexcept {
        rank_list out;
        if (fold_partner(r) >= 0) out.push_back(fold_partner(r));
        if (!is_folded(r))
            for (int s = 0; s < dimension_; ++s) out.push_back(partner(r, s));
        return out;
    }

private:
    rank_t size_;
    rank_t core_;
    rank_t extra_ = 0;
    int dimension_ = 0;
};

} // namespace chorus
