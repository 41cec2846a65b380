// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Elementwise passes for one thread of many: out[i] = finish(in(0)[i] step in(1)[i] ... step
// in(count-1)[i]), over the elements that thread t of `threads` owns. The device kernels
// (transport/cuda_ipc.hpp: reduce, fold, finish) and the signaled lanes (algorithm/detail/
// direct.hpp: a lane's copy and fold) are this pass, and the host tests run the same code at
// every alignment and thread count, so its index arithmetic is checked without a GPU.
//
// Why 16 bytes at a time: a thread that loads one element per instruction issues 16 / sizeof(T)
// times the memory instructions of one that loads 16 bytes (a v4 load): eight times for
// half and bfloat16, four for float. A GPU's load/store units, not its memory, can then bound
// a reduction (issue 16: a half or bfloat16 allreduce should run within 10% of float32's
// busbw). So the elements where every operand and `out` lie on a 16-byte boundary go as whole
// 16-byte vectors, one load per operand; the elements before the first boundary and after the
// last whole vector go one by one, and so does every element where the operands' addresses
// differ modulo 16 (a span that starts at an odd element on one side only). Both ways compute
// each element from the same operands in the same order: the results are the same bits.
//
// Aliasing: `out` may be one of the operands (a reduction in place): each element, and each
// vector, reads all its operands before it writes.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <chorus/config.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/traits.hpp>

namespace chorus::detail {

inline constexpr std::size_t wide_bytes = 16;

/// Types that go 16 bytes at a time: whole elements per vector, copyable as bits.
template <class T>
inline constexpr bool widens_v = std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T> &&
                                 sizeof(T) <= wide_bytes && wide_bytes % sizeof(T) == 0;

/// 16 bytes of elements, as a thread holds them in registers.
template <class T>
struct alignas(wide_bytes) wide_vector {
    static constexpr std::size_t size = wide_bytes / sizeof(T);
    T e[size];
};

/// Loads through plain pointers (device memory a kernel reads after the writes' kernels or
/// copies completed; host memory in the tests).
struct plain_loads {
    template <class T>
    CHORUS_HOST_DEVICE T load(T const* p) const noexcept {
        return *p;
    }
    template <class T>
    CHORUS_HOST_DEVICE wide_vector<T> load_wide(T const* p) const noexcept {
        wide_vector<T> v;
#if defined(__CUDA_ARCH__)
        uint4 const raw = *reinterpret_cast<uint4 const*>(p);  // one 16-byte load
        memcpy(&v, &raw, sizeof v);
#else
        std::memcpy(&v, p, sizeof v);
#endif
        return v;
    }
};

template <class T>
CHORUS_HOST_DEVICE void store_wide(T* p, wide_vector<T> const& v) noexcept {
#if defined(__CUDA_ARCH__)
    uint4 raw;
    memcpy(&raw, &v, sizeof raw);
    *reinterpret_cast<uint4*>(p) = raw;  // one 16-byte store
#else
    std::memcpy(p, &v, sizeof v);
#endif
}

/// The finish of a pass that has none (a plain reduction, a copy), and the step of a copy (a
/// pass of one operand, which never steps).
struct keep_value {
    template <class T>
    CHORUS_HOST_DEVICE T operator()(T x) const noexcept {
        return x;
    }
    template <class T>
    CHORUS_HOST_DEVICE T operator()(T x, T) const noexcept {
        return x;
    }
};

/// The finish of a fold by `op` over p ranks: the op's own (AVG's division by p), or none.
template <class Op>
struct op_finish {
    Op op;
    rank_t p;
    template <class T>
    CHORUS_HOST_DEVICE T operator()(T x) const {
        if constexpr (has_finalize<Op, T>) return static_cast<T>(op.finalize(x, p));
        else return x;
    }
};

/// The operands of a pass as an array of pointers (in(r) = p[r]): a kernel's argument array,
/// or the host's.
template <class T>
struct operand_array {
    T const* const* p;
    CHORUS_HOST_DEVICE T const* operator()(unsigned r) const noexcept { return p[r]; }
};

/// How a pass of n elements divides: `head` elements one by one, then `wide` whole vectors
/// from element `head`, then the rest one by one.
struct wide_split {
    std::size_t head = 0;
    std::size_t wide = 0;
};

/// The split of n elements at `out` and in(0) ... in(count - 1): no vector unless all of them
/// lie at the same offset modulo 16, and that offset is a whole number of elements short of a
/// boundary.
template <class T, class In>
CHORUS_HOST_DEVICE wide_split split_wide(T const* out, In const& in, unsigned count, std::size_t n) noexcept {
    if constexpr (!widens_v<T>) {
        return {n, 0};
    } else {
        auto const offset = [](void const* p) { return reinterpret_cast<std::uintptr_t>(p) % wide_bytes; };
        std::uintptr_t const at = offset(out);
        for (unsigned r = 0; r < count; ++r)
            if (offset(in(r)) != at) return {n, 0};
        std::size_t const to_boundary = (wide_bytes - at) % wide_bytes;
        if (to_boundary % sizeof(T) != 0) return {n, 0};
        std::size_t const head = to_boundary / sizeof(T) < n ? to_boundary / sizeof(T) : n;
        return {head, (n - head) / wide_vector<T>::size};
    }
}

/// The work items of a split: its vectors and its single elements (a kernel's grid size).
template <class T>
CHORUS_HOST_DEVICE constexpr std::size_t wide_items(wide_split s, std::size_t n) noexcept {
    if constexpr (widens_v<T>) return s.wide + (n - s.wide * wide_vector<T>::size);
    else return n;
}

/// out[i] = finish(in(0)[i] step ... step in(count - 1)[i]) for the elements of thread t of
/// `threads` (1 <= count); `in(r)` is the r-th operand's first element, `loads` reads them.
template <class T, class In, class Step, class Finish, class Loads = plain_loads>
CHORUS_HOST_DEVICE void fold_elements(T* out, In const& in, unsigned count, std::size_t n, std::size_t t, std::size_t threads,
                                      Step const& step, Finish const& finish, Loads const& loads = {}) {
    wide_split const s = split_wide(out, in, count, n);
    std::size_t tail = s.head;
    if constexpr (widens_v<T>) {
        constexpr std::size_t k = wide_vector<T>::size;
        for (std::size_t v = t; v < s.wide; v += threads) {
            std::size_t const i = s.head + v * k;
            wide_vector<T> acc = loads.load_wide(in(0) + i);
            for (unsigned r = 1; r < count; ++r) {
                wide_vector<T> const x = loads.load_wide(in(r) + i);
                for (std::size_t j = 0; j < k; ++j) acc.e[j] = static_cast<T>(step(acc.e[j], x.e[j]));
            }
            for (std::size_t j = 0; j < k; ++j) acc.e[j] = static_cast<T>(finish(acc.e[j]));
            store_wide(out + i, acc);
        }
        tail += s.wide * k;
    }
    auto const one = [&](std::size_t i) {
        T acc = loads.load(in(0) + i);
        for (unsigned r = 1; r < count; ++r) acc = static_cast<T>(step(acc, loads.load(in(r) + i)));
        out[i] = static_cast<T>(finish(acc));
    };
    for (std::size_t i = t; i < s.head; i += threads) one(i);
    for (std::size_t i = tail + t; i < n; i += threads) one(i);
}

} // namespace chorus::detail
