// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Names a user needs to specialise traits or declare functions without pulling in the
// algorithms: rank and tag types, the primary reduce_traits, the algorithm tags.

#include <cstdint>

namespace chorus {

/// Rank of a process within a transport's group, in `[0, size())`. Signed, so ring
/// arithmetic such as `(me - step + p) % p` stays readable (MPI uses int as well).
using rank_t = int;

/// Message tag. User point-to-point traffic may use any tag below `collective_tag_bit`;
/// collectives draw theirs from the transport's sequence with that bit set, so user
/// messages and collective messages never match each other.
using tag_t = std::uint64_t;

inline constexpr tag_t collective_tag_bit = tag_t{1} << 63;

struct host_memory;  // memory.hpp

/// What chorus knows about `Op` applied to `T`. Specialise it for your own operations.
/// The primary template promises nothing: not commutative, no identity.
template <class Op, class T>
struct reduce_traits {
    static constexpr bool is_commutative = false;
};

// Algorithm tags for the front doors: `chorus::allreduce<chorus::ring>(tp, data, op)`.
// A tag names a schedule; not every collective has every schedule (a static_assert says so).
struct automatic {};           ///< choose by message size, rank count and op (the default)
struct ring {};                ///< bandwidth-optimal ring
struct tree {};                ///< binomial tree (latency-optimal, log p steps)
struct linear {};              ///< root talks to every rank in turn (the naive schedule)
struct recursive_doubling {};  ///< hypercube exchange of the whole vector, log p steps
struct rabenseifner {};        ///< recursive-halving reduce-scatter + recursive-doubling allgather
struct pairwise {};            ///< p-1 rounds, round k exchanges with rank +-k
struct dissemination {};       ///< ceil(log2 p) rounds of zero-byte messages
struct scatter_allgather {};   ///< broadcast as binomial scatter + ring allgather (van de Geijn)
struct bruck {};               ///< ceil(log2 p) rounds at distances 1, 2, 4, ... for any p

} // namespace chorus
