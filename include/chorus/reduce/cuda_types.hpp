// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The built-in reduce operations on CUDA's 16-bit floating-point types, __half and
// __nv_bfloat16: commutative, with the identities of float (their arithmetic and comparisons
// come from cuda_fp16.h / cuda_bf16.h, on host and device). Included by cuda_ipc.hpp.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include <chorus/config.hpp>
#include <chorus/reduce/ops.hpp>

namespace chorus {

namespace detail {
template <class T>
inline constexpr bool is_cuda_16bit_float_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <class T>
CHORUS_HOST_DEVICE T cuda_16bit_from_float(float x) noexcept {
    if constexpr (std::is_same_v<T, __half>) return __float2half(x);
    else return __float2bfloat16(x);
}
} // namespace detail

template <class T>
    requires detail::is_cuda_16bit_float_v<T>
struct reduce_traits<sum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static T identity() noexcept { return detail::cuda_16bit_from_float<T>(-0.0f); }
};

template <class T>
    requires detail::is_cuda_16bit_float_v<T>
struct reduce_traits<avg, T> : reduce_traits<sum, T> {};

template <class T>
    requires detail::is_cuda_16bit_float_v<T>
struct reduce_traits<prod, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static T identity() noexcept { return detail::cuda_16bit_from_float<T>(1.0f); }
};

template <class T>
    requires detail::is_cuda_16bit_float_v<T>
struct reduce_traits<minimum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static T identity() noexcept { return detail::cuda_16bit_from_float<T>(__builtin_huge_valf()); }
};

template <class T>
    requires detail::is_cuda_16bit_float_v<T>
struct reduce_traits<maximum, T> {
    static constexpr bool is_commutative = true;
    CHORUS_HOST_DEVICE static T identity() noexcept { return detail::cuda_16bit_from_float<T>(-__builtin_huge_valf()); }
};

} // namespace chorus
