// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Memory spaces: where a transport's buffers live, and therefore where an algorithm's scratch
// is allocated and where its reductions run. One algorithm template serves host and device
// transports by calling these through `typename Transport::memory_space`.

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>

#include <chorus/config.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/traits.hpp>

namespace chorus {

/// Ordinary host memory. Reductions are plain loops that the compiler vectorises.
struct host_memory {
    /// Uninitialised scratch of `n` elements (never zero-filled: it is always overwritten).
    template <class T>
    class buffer {
    public:
        buffer() = default;
        explicit buffer(std::size_t n)
            : data_(n ? std::make_unique_for_overwrite<T[]>(n) : nullptr), size_(n) {}
        std::span<T> span() noexcept { return {data_.get(), size_}; }
        std::size_t size() const noexcept { return size_; }

    private:
        std::unique_ptr<T[]> data_;
        std::size_t size_ = 0;
    };

    /// dst = src (same sizes; the ranges may not overlap).
    template <class T>
    static void copy(std::span<T> dst, std::span<T const> src) noexcept {
        static_assert(std::is_trivially_copyable_v<T>);
        // memcpy with a null pointer is undefined even for zero bytes.
        if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size_bytes());
    }

    /// acc[i] = op(acc[i], in[i]), or op(in[i], acc[i]) when `in_first` (order matters for
    /// non-commutative operations: the left operand holds the lower ranks' contributions).
    template <class T, class Op>
    static void reduce(std::span<T> acc, std::span<T const> in, Op const& op, bool in_first) noexcept {
        reduce(acc, in_first ? in : std::span<T const>(acc), in_first ? std::span<T const>(acc) : in, op);
    }

    /// out[i] = op(a[i], b[i]); `out` may be `a` or `b` itself.
    template <class T, class Op>
    static void reduce(std::span<T> out, std::span<T const> a, std::span<T const> b, Op const& op) noexcept {
        // Separate pointers and a counted loop: g++ -O2 vectorises this for float/double
        // sum (with a runtime overlap check, since `out` may alias an input).
        T* o = out.data();
        T const* x = a.data();
        T const* y = b.data();
        std::size_t const n = out.size();
        for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<T>(op(x[i], y[i]));
    }

    /// Applies the operation's final step (AVG divides by the rank count) to a result.
    template <class T, class Op>
    static void finalize(std::span<T> data, Op const& op, rank_t p) noexcept {
        if constexpr (has_finalize<Op, T>) {
            for (T& x : data) x = op.finalize(x, p);
        }
    }
};

} // namespace chorus
