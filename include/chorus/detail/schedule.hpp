// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// How the front doors find an algorithm. Each algorithm header registers its schedule for the
// collective it implements, next to the function:
//
//   namespace detail {
//   template <>
//   inline constexpr auto schedule<collective_kind::allreduce, ring> = [](auto&... a) { ring_allreduce(a...); };
//   }
//
// (called with the front door's arguments, all lvalues: the transport, then the collective's
// own) and, if it does not serve every op and type, when it applies (schedule_applies; every
// ring schedule needs a commutative op, see algorithm/detail/collective.hpp).
//
// Each collective's algorithms are listed once, as an `algorithms<kind, tags...>` in
// collectives.hpp. From that list come the dispatch of `allreduce<ring>(...)` and of the
// automatic choice, the names CHORUS_ALGO accepts and CHORUS_DEBUG prints (each tag's `name`),
// and the compile error for a tag the collective does not have (detail/dispatch.hpp). Adding
// an algorithm: its header (function, schedule) and its tag in the list.

#include <chorus/detail/tags.hpp>

namespace chorus::detail {

/// The schedule of algorithm `Algo` for collective `K`: a callable taking the transport and
/// the front door's arguments. The primary is no callable: `Algo` is not an algorithm of `K`.
template <collective_kind K, class Algo>
inline constexpr auto schedule = nullptr;

/// Whether algorithm `Algo` of `K` serves elements `T` reduced with `Op` (`Op` is void for
/// collectives without one). Specialised by the algorithms that do not serve every op.
template <collective_kind K, class Algo, class T, class Op>
inline constexpr bool schedule_applies = true;

/// Whether algorithm `Algo` runs over `Transport`: every one does over every transport, but
/// those that need more than the transport concept (one_shot: a direct_transport).
template <class Algo, class Transport>
inline constexpr bool schedule_serves = true;

} // namespace chorus::detail
