// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <array>
#include <cstddef>

#include <chorus/fwd.hpp>

namespace chorus {

/// A short list of ranks held inline: topologies return these instead of vectors so that
/// asking for a rank's children allocates nothing. 64 entries cover every topology here for
/// any `int` rank count (a binomial tree has at most 31 children, a hypercube 31 partners).
class rank_list {
public:
    static constexpr std::size_t capacity = 64;

    constexpr void push_back(rank_t r) noexcept { ranks_[size_++] = r; }
    constexpr rank_t const* begin() const noexcept { return ranks_.data(); }
    constexpr rank_t const* end() const noexcept { return ranks_.data() + size_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr rank_t operator[](std::size_t i) const noexcept { return ranks_[i]; }
    friend constexpr bool operator==(rank_list const& a, rank_list const& b) noexcept {
        if (a.size_ != b.size_) return false;
        for (std::size_t i = 0; i < a.size_; ++i)
            if (a.ranks_[i] != b.ranks_[i]) return false;
        return true;
    }

private:
    std::array<rank_t, capacity> ranks_{};
    std::size_t size_ = 0;
};

} // namespace chorus
