// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Names a user needs to specialise traits or declare functions without pulling in the
// algorithms: rank and tag types, the primary reduce_traits, the algorithm tags.

#include <cstdint>
#include <string_view>

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
// A tag names a schedule; its `name` is what CHORUS_ALGO says and CHORUS_DEBUG prints. Not
// every collective has every schedule (each collective's list is in collectives.hpp; a tag
// not in it fails to compile, naming the list).
struct automatic {  ///< choose by message size, rank count and op (the default)
    static constexpr std::string_view name{"automatic"};
};
struct ring {  ///< bandwidth-optimal ring
    static constexpr std::string_view name{"ring"};
};
struct tree {  ///< binomial tree (latency-optimal, log p steps)
    static constexpr std::string_view name{"tree"};
};
struct linear {  ///< root talks to every rank in turn (the naive schedule)
    static constexpr std::string_view name{"linear"};
};
struct recursive_doubling {  ///< hypercube exchange of the whole vector, log p steps
    static constexpr std::string_view name{"recursive_doubling"};
};
struct rabenseifner {  ///< recursive-halving reduce-scatter + recursive-doubling allgather
    static constexpr std::string_view name{"rabenseifner"};
};
struct pairwise {  ///< p-1 rounds, round k exchanges with rank +-k
    static constexpr std::string_view name{"pairwise"};
};
struct dissemination {  ///< ceil(log2 p) rounds of zero-byte messages
    static constexpr std::string_view name{"dissemination"};
};
struct scatter_allgather {  ///< broadcast as binomial scatter + ring allgather (van de Geijn)
    static constexpr std::string_view name{"scatter_allgather"};
};
struct bruck {  ///< ceil(log2 p) rounds at distances 1, 2, 4, ... for any p
    static constexpr std::string_view name{"bruck"};
};
struct one_shot {  ///< one round: every rank reads the blocks it needs from its peers' memory (direct_transport)
    static constexpr std::string_view name{"one_shot"};
};
struct two_shot {  ///< reduce-scatter then allgather, each one round reading the peers' buffers in place (exposing_transport)
    static constexpr std::string_view name{"two_shot"};
};
struct zero_copy {  ///< one round reading the peers' buffers where they lie, no staging copy (exposing_transport)
    static constexpr std::string_view name{"zero_copy"};
};
struct hierarchical {  ///< inside each node, then across the nodes (node_transport), then inside again
    static constexpr std::string_view name{"hierarchical"};
};

} // namespace chorus
