// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// numeric_limits usable from host and device code: under nvcc, std::numeric_limits members
// are host-only constexpr functions (warning 20013), so use libcu++'s copy there.
#if defined(__CUDACC__)
#  include <cuda/std/limits>
namespace chorus::detail {
template <class T>
using numeric_limits = ::cuda::std::numeric_limits<T>;
}
#else
#  include <limits>
namespace chorus::detail {
template <class T>
using numeric_limits = std::numeric_limits<T>;
}
#endif
