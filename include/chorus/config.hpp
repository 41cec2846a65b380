// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Marks functions callable from host and device code (reduce operations, their traits).
// Under nvcc it expands to __host__ __device__; elsewhere to nothing. A user may define it
// first, as for every configuration macro here.
#ifndef CHORUS_HOST_DEVICE
#  if defined(__CUDACC__) || defined(__HIPCC__)
#    define CHORUS_HOST_DEVICE __host__ __device__
#  else
#    define CHORUS_HOST_DEVICE
#  endif
#endif
