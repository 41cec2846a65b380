// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <chorus/topology/rank_list.hpp>

namespace chorus {

/// Ranks on a directed ring: rank r sends to right(r) = r+1 and receives from left(r) = r-1
/// (mod p). The schedule of ring_allreduce, ring_allgather and ring_reduce_scatter.
class ring_topology {
public:
    constexpr explicit ring_topology(rank_t size) noexcept : size_(size) {}
    constexpr rank_t size() const noexcept { return size_; }
    constexpr rank_t right(rank_t r) const noexcept { return (r + 1) % size_; }
    constexpr rank_t left(rank_t r) const noexcept { return (r + size_ - 1) % size_; }
    /// {left, right}, one entry when they coincide (p = 2), none when p = 1.
    constexpr rank_list neighbours(rank_t r) const noexcept {
        rank_list out;
        if (size_ > 1) out.push_back(left(r));
        if (size_ > 2) out.push_back(right(r));
        return out;
    }

private:
    rank_t size_;
};

} // namespace chorus
