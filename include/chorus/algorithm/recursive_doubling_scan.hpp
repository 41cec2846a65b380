// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Recursive-doubling scan and exscan (MPI_Scan, MPI_Exscan): rank r gets the reduction of
// ranks 0 .. r (scan) or 0 .. r-1 (exscan), in rank order, so any op.
// Schedule: ceil(log2 p) rounds; in round k rank r exchanges with r xor 2^k (when that rank
// exists) its `partial`, the reduction over its aligned block of 2^k ranks. The partner's
// partial covers the ranks just below or just above that block: below, it joins both the
// partial and the result on the left; above, only the partial, on the right.
// Cost: ceil(log2 p) * (alpha + n * beta + 2 n * gamma) per rank. AVG divides by the number of
// ranks reduced (r + 1, or r for exscan).

#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

template <transport Transport, class T, class Op>
void scan_steps(Transport& tp, collective_kind kind, std::span<T const> send, std::span<T> recv, Op const& op) {
    bool const inclusive = kind == collective_kind::scan;
    char const* const name = kind_name(kind);
    check_size(tp, recv.size() == send.size(), name,
               "the receive buffer holds " + std::to_string(recv.size()) + " elements but the send buffer " +
                   std::to_string(send.size()));
    tag_t const tag = begin_collective(tp, kind);
    using space = typename Transport::memory_space;
    rank_t const p = tp.size(), me = tp.rank();
    typename space::template buffer<T> partial(send.size()), inbox(p > 1 ? send.size() : 0);
    space::copy(partial.span(), send);  // first: in place, recv is send
    if (inclusive && recv.data() != send.data()) space::copy(recv, send);
    bool have = inclusive;  // whether recv holds a reduction yet (exscan: not before a lower rank's)
    for (rank_t mask = 1; mask < p; mask <<= 1) {
        rank_t const partner = me ^ mask;
        if (partner >= p) continue;
        sendrecv(tp, tag, partner, as_const(partial.span()), partner, inbox.span());
        bool const below = partner < me;
        space::reduce(partial.span(), as_const(inbox.span()), op, /*in_first=*/below);
        if (!below) continue;
        if (have) space::reduce(recv, as_const(inbox.span()), op, /*in_first=*/true);
        else space::copy(recv, as_const(inbox.span()));
        have = true;
    }
    if (have) space::finalize(recv, op, inclusive ? me + 1 : me);
}

} // namespace detail

/// Rank r receives, in `recv`, the reduction with `op` of `send` over ranks 0 .. r, in rank
/// order. `recv` may be `send` itself (in place).
/// @throws chorus::invalid_argument when recv.size() != send.size().
template <transport Transport, class T, reduce_op<T> Op>
void recursive_doubling_scan(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    detail::scan_steps(tp, detail::collective_kind::scan, send, recv, op);
}

/// Rank r receives the reduction over ranks 0 .. r-1; rank 0's `recv` is left as it was.
template <transport Transport, class T, reduce_op<T> Op>
void recursive_doubling_exscan(Transport& tp, std::span<T const> send, std::span<T> recv, Op op) {
    detail::scan_steps(tp, detail::collective_kind::exscan, send, recv, op);
}

namespace detail {  // for the front door (detail/schedule.hpp)
template <> inline constexpr auto schedule<collective_kind::scan, recursive_doubling> =
    [](auto&... a) { recursive_doubling_scan(a...); };
template <> inline constexpr auto schedule<collective_kind::exscan, recursive_doubling> =
    [](auto&... a) { recursive_doubling_exscan(a...); };
}

} // namespace chorus
