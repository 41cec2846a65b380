// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The transport concept: what every algorithm may assume of the thing that moves bytes.
// The full semantic contract, with a table per operation, is docs/concepts.md#transport.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <type_traits>

#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/signals.hpp>

namespace chorus {

/// A handle on one non-blocking send or receive.
/// - `wait()` returns once the operation completed (a send's buffer may be reused, a
///   receive's buffer holds the message). It never blocks longer than the transport's
///   timeout; it throws `chorus::timeout_error` then, or `chorus::transport_error` when the
///   operation failed (size or tag mismatch, peer failure). A second `wait()` returns at once.
/// - `test()` returns whether the operation completed, without blocking; it throws as
///   `wait()` does when the operation failed.
/// - A request that is destroyed before completing cancels its operation (the buffer is not
///   touched afterwards); in that case the group is aborted, since the peer's matching
///   message would otherwise be lost.
template <class R>
concept request = std::movable<R> && requires(R& r) {
    r.wait();
    { r.test() } -> std::same_as<bool>;
};

/// A group of `size()` processes that exchange tagged byte messages point to point.
///
/// Requirements (docs/concepts.md#transport), in brief:
/// 1. `isend(peer, tag, bytes)` / `irecv(peer, tag, bytes)` start a transfer and return a
///    `request`; the buffer must stay valid until the request completed.
/// 2. Messages are matched by (sender, tag); messages from one sender with one tag are
///    received in the order they were sent. Zero-length messages are legal. `peer` may be
///    the calling rank itself.
/// 3. A message whose size differs from the posted buffer is an error (`errc::size_mismatch`)
///    naming the peer, never a truncation.
/// 4. Progress: every posted send completes once the receiver posts the matching receive,
///    regardless of the order in which ranks post operations (no deadlock when every rank
///    sends before it receives).
/// 5. `next_sequence()` returns 0, 1, 2, ... on successive calls; collectives build their tags
///    from it, so every rank must call collectives in the same order.
/// 6. `abort(reason)` marks the group as failed: every pending and later operation on every
///    rank fails with `errc::peer_failed` naming this rank. Collectives call it before they
///    throw, so a failed collective says so on every rank instead of leaving peers waiting.
/// 7. `memory_space` (a chorus::memory_space) says where message buffers live
///    (`chorus::host_memory` or a device space); algorithms allocate scratch and reduce
///    through it.
template <class T>
concept transport = requires(T& t, T const& ct, rank_t peer, tag_t tag,
                             std::span<std::byte const> out, std::span<std::byte> in,
                             char const* reason) {
    requires memory_space<typename T::memory_space>;
    typename T::request;
    requires request<typename T::request>;
    { ct.rank() } noexcept -> std::same_as<rank_t>;
    { ct.size() } noexcept -> std::same_as<rank_t>;
    { t.isend(peer, tag, out) } -> std::same_as<typename T::request>;
    { t.irecv(peer, tag, in) } -> std::same_as<typename T::request>;
    { t.next_sequence() } -> std::same_as<std::uint64_t>;
    { t.abort(reason) } noexcept;
};

namespace detail {

// The ring allreduce's segment where a transport asks for none (algorithm/ring_allreduce.hpp):
// 256 KiB, large enough that the per-message cost (a syscall, a header) is small next to the
// transfer, small enough that a 4-segment window pipelines vectors of a few MiB.
inline constexpr std::size_t ring_segment_bytes = 256 * 1024;

/// The segment a transport type declares: its constant `Transport::ring_segment_bytes`, or the
/// default. A constant only: a transport that answers by its ranks (node_transport, a
/// sub-group) is asked through ring_segment_bytes_of.
template <class Transport>
constexpr std::size_t declared_ring_segment_bytes() noexcept {
    if constexpr (requires { std::size_t{Transport::ring_segment_bytes}; }) return Transport::ring_segment_bytes;
    else return ring_segment_bytes;
}

/// The ring allreduce's segment over `tp`, in bytes (docs/concepts.md#transport): what the
/// transport asks for — `tp.ring_segment_bytes()` where it depends on the ranks (a node
/// transport's ring crosses hosts or not; a sub-group asks its parent for its own ranks), else
/// its declared constant — or the default. Every rank of a group must get the same value: it
/// decides the ring's message sizes.
template <class Transport>
std::size_t ring_segment_bytes_of(Transport const& tp) noexcept {
    if constexpr (requires { { tp.ring_segment_bytes() } -> std::convertible_to<std::size_t>; }) return tp.ring_segment_bytes();
    else return declared_ring_segment_bytes<Transport>();
}

} // namespace detail

/// Blocks of a direct exchange start at addresses aligned to this (direct_transport).
inline constexpr std::size_t direct_alignment = 32;

namespace detail {
/// Whether blocks of `T` sit aligned in a direct exchange (void: a collective without data).
template <class T>
constexpr bool direct_aligned() noexcept {
    if constexpr (std::is_void_v<T>) return true;
    else return alignof(T) <= direct_alignment;
}
} // namespace detail

/// A transport whose ranks read each other's memory where it lies (one host's shared memory;
/// one node's GPUs through CUDA IPC): the one_shot collectives run over it in a single round
/// of `exchange` (docs/concepts.md#direct_transport).
/// - `exchange(pieces, agreed, tag)` publishes this rank's block, the concatenation of
///   `pieces` (at most `direct_bytes()` bytes in all, possibly none), with a word `agreed`, and
///   returns once every rank of the group published its block of the same round (every rank
///   calls it, in the same order as its collectives). It waits as a receive does: bounded by
///   the timeout, failing as a receive of `tag` from the rank it waits for, moving the
///   transport's messages meanwhile.
/// - Until this rank's next `exchange`, `block(r)` views rank r's block of the round (aligned
///   to direct_alignment) and `agreed(r)` its word; this rank's own block included.
/// - A rank publishes round k + 2 only after every rank published round k + 1, which each does
///   once done reading round k: two slots per rank keep every block readable for its round,
///   without a handshake.
template <class T>
concept direct_transport = transport<T> && requires(T& t, T const& ct, std::span<std::span<std::byte const> const> pieces,
                                                    std::uint64_t word, tag_t tag, rank_t r) {
    { ct.direct_bytes() } noexcept -> std::same_as<std::size_t>;
    t.exchange(pieces, word, tag);
    { ct.block(r) } noexcept -> std::same_as<std::span<std::byte const>>;
    { ct.agreed(r) } noexcept -> std::same_as<std::uint64_t>;
};

/// A direct_transport whose round can wait for one rank's block only: a broadcast's root then
/// returns once its block is published, and the others once the root's is readable, none of
/// them waiting for the slowest rank (docs/concepts.md#rooted_transport).
/// - `exchange(pieces, agreed, tag, from)` is a round of `exchange` (same order, failures)
///   that returns once rank `from`'s block of the round is readable (at once where `from` is
///   this rank; every rank's where it is -1): only `block(from)` and `agreed(from)` are then
///   this round's.
/// - `await_round()` waits, as `exchange` does, until every rank published its block of this
///   rank's latest round: then `block(r)` and `agreed(r)` are this round's for every r. It
///   returns whether it waited (false: the round was every rank's already). The next round
///   waits so first by itself, before it writes over the slot of the round before; every
///   collective starts with it (begin_collective), and checks the round's shapes where it waited.
template <class T>
concept rooted_transport = direct_transport<T> && requires(T& t, std::span<std::span<std::byte const> const> pieces,
                                                           std::uint64_t word, tag_t tag, rank_t r) {
    t.exchange(pieces, word, tag, r);
    { t.await_round() } -> std::same_as<bool>;
};

/// A direct_transport whose ranks can also read a caller's buffer where it lies, no copy into a
/// slot first: the large collectives then move each byte once (docs/concepts.md#exposing_transport).
/// - `expose(buffer, agreed, tag)` is a round of the direct exchange (same order, waits and
///   failures as `exchange`) whose block is `buffer` itself, of any size. It returns whether
///   every rank's buffer could be exposed (memory the device cannot export to its peers cannot
///   be); where not, every rank's block of the round is empty and every rank returns false.
/// - `expose(buffer, parts, agreed, tag)` is the same round where each peer reads only a part
///   of `buffer`: `parts[r]` (p subranges of `buffer`) is rank r's block of this rank, so a
///   peer learns where its part lies and its size (alltoallv: a block of any size for each
///   rank), and a peer whose part is empty maps nothing.
/// - Until the round after the next, the peers may read the buffer: a collective that exposes
///   one ends with a further round (an empty `exchange`) and leaves the buffer to its caller
///   only once that returned; it writes into its own exposed buffer only what no peer reads then.
namespace detail {
/// What is wrong with the parts of an exposure in parts (`who`: the transport, for the
/// message): one part per rank, each empty or inside `buffer`; "" where nothing is.
inline std::string exposed_parts_error(char const* who, std::size_t ranks, std::span<std::byte const> buffer,
                                       std::span<std::span<std::byte const> const> parts) {
    if (parts.size() != ranks)
        return std::string(who) + ": an exposure in parts needs one part per rank (" + std::to_string(ranks) + "), got " +
               std::to_string(parts.size());
    for (auto const& part : parts)
        if (!part.empty() && (std::less<>{}(part.data(), buffer.data()) ||
                              std::less<>{}(buffer.data() + buffer.size(), part.data() + part.size())))
            return std::string(who) + ": an exposed part lies outside the exposed buffer";
    return {};
}
} // namespace detail

template <class T>
concept exposing_transport =
    direct_transport<T> && requires(T& t, std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts,
                                    std::uint64_t word, tag_t tag) {
        { t.expose(buffer, word, tag) } -> std::same_as<bool>;
        { t.expose(buffer, parts, word, tag) } -> std::same_as<bool>;
    };

/// An exposing_transport that also keeps buffers exposed across collectives (as NCCL's
/// registered buffers): the peers open a registered buffer's memory once, and a collective on any
/// range inside it then exposes it without a new export or open (docs/concepts.md#registering_transport).
/// - `keep(buffer, agreed, tag)` is a round of `expose` that registers `buffer`; it returns the
///   registration's number, the same on every rank, or 0 on every rank where some rank's buffer
///   could not be exported (nothing is kept then).
/// - `release(registration, agreed, tag)` closes what this rank kept for it and returns after a
///   round in which every rank did: each may then free its buffer. The caller must not free a
///   registered buffer before (its peers' mappings of freed memory are undefined).
template <class T>
concept registering_transport =
    exposing_transport<T> && requires(T& t, std::span<std::byte const> buffer, std::uint64_t word, tag_t tag) {
        { t.keep(buffer, word, tag) } -> std::same_as<std::uint64_t>;
        t.release(word, word, tag);
    };

/// An exposing_transport whose ranks may also write into the buffers their peers exposed, as
/// MSCCL++'s put (docs/concepts.md#putting_transport): a broadcast's root, idle while the others
/// read its vector, writes part of it into theirs, and the copy takes the time of a share.
/// - `exposable(buffer)`: whether `buffer` (not empty) could be exposed now, answered by this
///   rank alone, without a round: a rank offers its buffer only where that cannot make the round
///   fall back.
/// - `put_block(r)`: after an exposure round that returned true, rank r's block of it
///   (`block(r)`, at the same offset within a 4096-byte page as rank r's buffer) as memory this
///   rank may write until the closing round; empty for this rank's own block. A collective
///   writes only into a buffer its owner exposed as an output for this (never a send buffer),
///   into bytes both agree on without a message, and closes with a round of every rank, whose
///   return makes the writes visible to the owner.
template <class T>
concept putting_transport = exposing_transport<T> && requires(T& t, std::span<std::byte const> buffer, rank_t r) {
    { t.exposable(buffer) } -> std::same_as<bool>;
    { t.put_block(r) } -> std::same_as<std::span<std::byte>>;
};

/// A direct_transport whose device runs a whole collective in one launch, its ranks
/// synchronising through flags in each other's memory — put, signal, wait, as MSCCL++'s
/// primitives — with no host round trip (transport/signals.hpp; docs/concepts.md#signaling_transport).
/// - `signal_bytes()`: the largest collective a launch serves, the same on every rank; 0: none
///   (the device cannot, or some rank did not ask for it).
/// - `launch(body, bytes, shape, describe)` queues one launch of `body` (a trivially copyable
///   functor whose `operator()(Channel&)` is CHORUS_HOST_DEVICE; the channel is
///   detail::signal_channel: its slots, barrier(), lanes and threads), in order with the rank's
///   other device work. Every rank launches the same shape (a word: collective, bytes, root;
///   `describe` says it in words); one that does not come within the timeout, or comes with
///   another shape, fails the group on every rank, naming it.
template <class T>
concept signaling_transport =
    direct_transport<T> && requires(T& t, detail::signal_probe const& body, std::size_t n, std::uint64_t word,
                                    std::string (*describe)(std::uint64_t)) {
        { t.signal_bytes() } -> std::same_as<std::size_t>;
        t.launch(body, n, word, describe);
    };

/// A transport whose buffers are ordinary host memory (`std::vector`, arrays).
template <class T>
concept host_transport = transport<T> && std::same_as<typename T::memory_space, host_memory>;

/// The device of a staged transport (transport/staged.hpp): memory other ranks can open, and
/// copies that complete asynchronously, in the order they were enqueued. Models: CUDA IPC's
/// device (cuda_ipc.hpp) and a host model in the tests. docs/concepts.md#staged_device.
/// - `allocate_shared` memory can be exported (`export_handle`) and opened by other ranks
///   (`open_handle`, `close_handle`); `release_shared` frees it, `abandon_shared` leaves it to
///   the end of the process (a peer may still have it open); `allocate`/`release`: staging.
/// - `copy` enqueues; `record()` returns an event that is `done` once every copy enqueued
///   before it completed; `synchronize()` waits for all.
/// - optionally `export_range(p, n)`: the handle of the allocation holding [p, p + n) and the
///   offset of p in it (a struct with `handle` and `offset`), or std::nullopt where that memory
///   cannot be exported; the staged transport is then an exposing_transport.
/// - `check_current()` throws unless the calling thread may use the device;
///   `scoped_current()` makes it usable for a scope (a destructor on another thread).
template <class D>
concept staged_device = std::move_constructible<D> && std::is_trivially_copyable_v<typename D::handle> &&
    requires(D& d, void* p, void const* cp, std::size_t n, typename D::handle const& h, typename D::event& e) {
        typename D::memory_space;
        { d.allocate_shared(n) } -> std::same_as<void*>;
        { d.release_shared(p) } noexcept;
        { d.abandon_shared(p) } noexcept;
        d.check_current();
        { d.scoped_current() } noexcept;
        { d.allocate(n) } -> std::same_as<void*>;
        { d.release(p) } noexcept;
        { d.export_handle(p) } -> std::same_as<typename D::handle>;
        { d.open_handle(h) } -> std::same_as<void*>;
        { d.close_handle(p) } noexcept;
        d.copy(p, cp, n);
        { d.record() } -> std::same_as<typename D::event>;
        { d.done(e) } -> std::same_as<bool>;
        { d.release(e) } noexcept;
        { d.synchronize() } noexcept;
    };

/// A transport that can carry a staged transport's control messages: host memory, and
/// requests that can be let go without cancelling (`detach()`, for the receives still
/// pending when the staged transport shuts down). Semantic requirement: one peer's messages
/// arrive in the order they were sent, whatever their tag (a receive posted for a later
/// message's tag completes only after every earlier message of that peer was matched or
/// queued): the staged protocol sends a record on one tag and the word that needs it on another.
template <class T>
concept control_transport = host_transport<T> && requires(typename T::request& r, T const& t) {
    r.detach();
    { t.timeout() } -> std::convertible_to<std::chrono::milliseconds>;
};

} // namespace chorus
