// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// What every algorithm needs: typed views of byte messages, blocking steps built from the
// transport's non-blocking primitives, a bounded window of requests in flight, argument
// checks that fail the whole group, and the partition of a vector into blocks.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/algorithm/detail/shape.hpp>
#include <chorus/detail/schedule.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/traits.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

template <class T>
std::span<std::byte const> bytes_of(std::span<T const> s) noexcept {
    return std::as_bytes(s);
}
template <class T>
std::span<std::byte const> bytes_of(std::span<T> s) noexcept {
    return std::as_bytes(s);
}
template <class T>
std::span<std::byte> writable_bytes_of(std::span<T> s) noexcept {
    return std::as_writable_bytes(s);
}

/// A ring combines contributions in ring order, not in rank order: where there is a reduction,
/// a ring schedule needs a commutative op (the automatic choice passes over it otherwise).
template <collective_kind K, class T, class Op>
inline constexpr bool schedule_applies<K, ring, T, Op> = std::is_void_v<Op> || is_commutative_v<Op, T>;

/// Starts a collective: draws its tag from the transport's sequence. Over a rooted_transport,
/// first waits for every rank's block of a round that waited for its root only (a one_shot
/// broadcast's), and checks that every rank called that collective alike: its root returned
/// without knowing, and nothing else compares the shape of a rank that took itself for the root.
template <transport Transport>
tag_t begin_collective(Transport& tp, collective_kind kind) {
    if constexpr (rooted_transport<Transport>)
        if (tp.await_round()) check_round_shapes(tp);
    return make_collective_tag(kind, tp.next_sequence());
}

/// Fails the group, then throws: a rank that detects bad input must not leave its peers
/// waiting for messages it will never send.
template <transport Transport>
[[noreturn]] void fail_argument(Transport& tp, std::string const& what) {
    std::string const full = "rank " + std::to_string(tp.rank()) + ": " + what;
    tp.abort(full.c_str());
    throw invalid_argument(full);
}

template <transport Transport>
void check_root(Transport& tp, rank_t root, char const* collective) {
    if (root < 0 || root >= tp.size())
        fail_argument(tp, std::string(collective) + ": root " + std::to_string(root) +
                              " is out of range for a group of " + std::to_string(tp.size()) + " ranks");
}

template <transport Transport>
void check_size(Transport& tp, bool ok, char const* collective, std::string const& what) {
    if (!ok) fail_argument(tp, std::string(collective) + ": " + what);
}

/// Checks that a buffer holds one block of `block` elements per rank (the layout of scatter,
/// gather, allgather and reduce_scatter). `what` names the buffer and `per` the block's source.
template <transport Transport>
void check_blocks(Transport& tp, char const* collective, char const* what, std::size_t have, char const* per,
                  std::size_t block) {
    auto const p = static_cast<std::size_t>(tp.size());
    if (have != p * block)  // the message is built only on failure: this runs on every call
        fail_argument(tp, std::string(collective) + ": " + what + " holds " + std::to_string(have) +
                              " elements, expected ranks * " + per + " = " + std::to_string(p) + " * " +
                              std::to_string(block));
}

/// check_blocks, then begin_collective: the start of the collectives over p blocks.
template <transport Transport>
tag_t begin_blocks(Transport& tp, collective_kind kind, char const* what, std::size_t have, char const* per,
                   std::size_t block) {
    check_blocks(tp, kind_name(kind), what, have, per, block);
    return begin_collective(tp, kind);
}

/// Checks the layout of alltoall: send and receive buffers of equal size, p blocks each.
template <transport Transport>
void check_alltoall_blocks(Transport& tp, std::size_t send, std::size_t recv) {
    auto const p = static_cast<std::size_t>(tp.size());
    if (send != recv || send % p != 0)
        fail_argument(tp, "alltoall: send (" + std::to_string(send) + ") and receive (" + std::to_string(recv) +
                              ") buffers must have equal sizes, a multiple of the " + std::to_string(p) + " ranks");
}

template <transport Transport, class T>
void send(Transport& tp, tag_t tag, rank_t peer, std::span<T const> out) {
    tp.isend(peer, tag, bytes_of(out)).wait();
}

template <transport Transport, class T>
void recv(Transport& tp, tag_t tag, rank_t peer, std::span<T> in) {
    tp.irecv(peer, tag, writable_bytes_of(in)).wait();
}

/// Sends `out` to `dst` while receiving `in` from `src`; returns when both completed. The
/// receive is posted first, so a transport can land the message straight in `in`.
template <transport Transport, class T>
void sendrecv(Transport& tp, tag_t tag, rank_t dst, std::span<T const> out, rank_t src, std::span<T> in) {
    auto r = tp.irecv(src, tag, writable_bytes_of(in));
    auto s = tp.isend(dst, tag, bytes_of(out));
    s.wait();
    r.wait();
}

/// A bounded FIFO of requests in flight, allocated once: the pipelined schedules keep a
/// window of sends or receives outstanding without allocating per message (the request
/// type need not be default-constructible, hence the optionals). Requests complete in the
/// order they were started, as the schedules consume them. Only a wait that threw leaves
/// requests behind; destroying them cancels them, which aborts the group (already failed).
template <class Request>
class request_window {
public:
    explicit request_window(std::size_t capacity) : slots_(capacity == 0 ? 1 : capacity) {}
    std::size_t size() const noexcept { return count_; }
    bool empty() const noexcept { return count_ == 0; }
    bool full() const noexcept { return count_ == slots_.size(); }
    /// Pre: !full().
    void push(Request r) {
        slots_[(head_ + count_) % slots_.size()].emplace(std::move(r));
        ++count_;
    }
    /// Waits for the oldest request and drops it. Pre: !empty().
    void wait_front() {
        auto& slot = slots_[head_];
        slot->wait();
        slot.reset();
        head_ = (head_ + 1) % slots_.size();
        --count_;
    }
    void wait_all() {
        while (!empty()) wait_front();
    }

private:
    std::vector<std::optional<Request>> slots_;
    std::size_t head_ = 0;
    std::size_t count_ = 0;
};

/// Position of `i` on a ring of `p` ranks, for any (possibly negative) `i`.
constexpr std::size_t ring_index(rank_t i, rank_t p) noexcept {
    return static_cast<std::size_t>(((i % p) + p) % p);
}

/// Block `i` of `parts` near-equal contiguous blocks of `data`: [i*n/parts, (i+1)*n/parts).
/// Sizes differ by at most one; block 0 is the smallest, the last block the largest; blocks
/// are empty when n < parts.
template <class T>
constexpr std::span<T> block(std::span<T> data, std::size_t i, std::size_t parts) noexcept {
    std::size_t const n = data.size();
    std::size_t const lo = n * i / parts;
    return data.subspan(lo, n * (i + 1) / parts - lo);
}

/// Blocks [lo, hi) of `parts`, as one contiguous span.
template <class T>
constexpr std::span<T> blocks(std::span<T> data, std::size_t lo, std::size_t hi, std::size_t parts) noexcept {
    std::size_t const n = data.size();
    std::size_t const first = n * lo / parts;
    return data.subspan(first, n * hi / parts - first);
}

/// dst = src where dst is part of an output buffer of `whole` bytes: host memory streams it
/// past the cache when the buffer is large (host_memory::copy_part); other spaces copy.
template <class Space, class T>
void copy_part(std::span<T> dst, std::span<T const> src, std::size_t whole) {
    if constexpr (requires { Space::copy_part(dst, src, whole); }) Space::copy_part(dst, src, whole);
    else Space::copy(dst, src);
}

/// Equal block `i` of size `n` (the layout of scatter, gather, allgather, alltoall).
template <class T>
constexpr std::span<T> slot(std::span<T> data, rank_t i, std::size_t n) noexcept {
    return data.subspan(static_cast<std::size_t>(i) * n, n);
}

template <class T>
constexpr std::span<T const> as_const(std::span<T> s) noexcept {
    return s;
}

} // namespace chorus::detail
