// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Typed point-to-point front doors over any transport: send, recv, isend, irecv, sendrecv.
// They take contiguous ranges of trivially copyable elements and a user tag (default 0).

#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/error.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
template <transport Transport>
void check_p2p(Transport& tp, rank_t peer, tag_t tag, char const* what) {
    if (peer < 0 || peer >= tp.size())
        fail_argument(tp, std::string(what) + ": peer " + std::to_string(peer) + " is out of range for a group of " +
                              std::to_string(tp.size()) + " ranks");
    if (is_collective_tag(tag))
        fail_argument(tp, std::string(what) + ": tag " + std::to_string(tag) +
                              " is reserved for collectives (user tags are below 2^63)");
}
} // namespace detail

/// Starts sending `data` to `peer`; the range must stay alive and unchanged until the
/// returned request's wait() returned.
template <transport Transport, message_range R>
typename Transport::request isend(Transport& tp, rank_t peer, R const& data, tag_t tag = 0) {
    detail::check_p2p(tp, peer, tag, "isend");
    return tp.isend(peer, tag, detail::bytes_of(detail::to_span(data)));
}

/// Starts receiving exactly `data`'s size from `peer` into `data`; a message of another
/// size is an error (errc::size_mismatch) when waited for.
template <transport Transport, writable_message_range R>
typename Transport::request irecv(Transport& tp, rank_t peer, R&& data, tag_t tag = 0) {
    detail::check_p2p(tp, peer, tag, "irecv");
    return tp.irecv(peer, tag, detail::writable_bytes_of(detail::to_span(data)));
}

/// Sends `data` to `peer`; returns once `data` may be reused.
template <transport Transport, message_range R>
void send(Transport& tp, rank_t peer, R const& data, tag_t tag = 0) {
    chorus::isend(tp, peer, data, tag).wait();
}

/// Receives a message of exactly `data`'s size from `peer` into `data`.
template <transport Transport, writable_message_range R>
void recv(Transport& tp, rank_t peer, R&& data, tag_t tag = 0) {
    chorus::irecv(tp, peer, std::forward<R>(data), tag).wait();
}

/// Sends `out` to `dst` and receives `in` from `src` at once: the step of every ring
/// schedule, deadlock-free even when all ranks call it simultaneously.
template <transport Transport, message_range Out, writable_message_range In>
void sendrecv(Transport& tp, rank_t dst, Out const& out, rank_t src, In&& in, tag_t tag = 0) {
    auto r = chorus::irecv(tp, src, std::forward<In>(in), tag);
    auto s = chorus::isend(tp, dst, out, tag);
    s.wait();
    r.wait();
}

/// Waits for every request; the first failure is thrown (the rest are then cancelled).
template <class Requests>
void wait_all(Requests& requests) {
    for (auto& r : requests) r.wait();
}

} // namespace chorus
