// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The staged protocol, of the transports whose ranks share memory that only a device can copy
// (CUDA IPC): messages move through per-peer FIFOs in the receiver's memory, and a control
// channel (any control_transport: shared memory between processes, loopback in tests) carries the
// little that must cross between ranks — the FIFO handles once, at set-up, then one header per
// chunk and the credits that free the slots.
//
// For one ordered pair of ranks s -> r (the pair s -> s, messages to self, too):
// - r owns a FIFO for s: `slots` slots of `chunk` bytes in its memory, exported once
//   (Device::export_handle) and opened by s (Device::open_handle).
// - s sends its messages in the order they were posted. A message is cut into chunks; for
//   each, s takes a free slot (a credit), enqueues a copy from its buffer into that slot of
//   r's FIFO, and records an event. Once the event has completed, s sends r the chunk's header
//   (tag, message size, offset, length, slot) over the control channel. The send is complete
//   when the copies of all its chunks are: its buffer may be reused.
// - r reads the headers in order. The first chunk of a message is matched (detail/matching.hpp)
//   to the oldest receive posted for (s, tag), whose size must equal the message's, or else is
//   unexpected: it is staged in a scratch allocation until its receive is posted. r enqueues a
//   copy from the slot to the receive buffer; once it completed, the slot goes back to s as a
//   credit and, after the last chunk, the receive is complete.
// Ordering needs no more than this: copies on one rank complete in the order they were
// enqueued (one stream), headers and credits travel in order (one control tag each), and the
// slots are used round robin.
//
// Rendezvous (`rendezvous_bytes`, where the device exports a caller's memory): a message to
// another rank of at least that size is not cut into chunks. When its turn among s's messages
// to r comes, s exports the allocation holding its buffer (Device::export_range; the number of
// a registration it lies in instead, whose allocation r keeps open), waits for its own earlier
// work as for a chunk's copy, and sends r a record on control tag 3 (where it lies) followed by
// a `rendezvous` header on tag 1 in the place a first chunk would take. The control channel keeps
// a peer's order across tags, so r has the record when it reads the header; it matches the
// header as a first chunk, opens s's allocation and copies the message once, from where it lies
// into the receive buffer (or, before its receive is posted, into staging, as the chunks of an
// unexpected message go: the send never waits for the receiver's code), then closes it and sends
// s a `delivered` word, on which the send completes. One device copy and one control message
// each way per message, where the FIFO takes two copies and a message each way per chunk; memory
// the device cannot export takes the FIFO. Sends to the rank itself always take its FIFO.
// A sender's buffer is read by a peer until `delivered` came. If the group fails meanwhile, the
// send fails at once while the receiver may still have the copy queued (as a failed collective's
// exposed buffers may still be read): a caller that frees the buffer of a failed send may free
// memory a peer still maps, which CUDA calls undefined. After a failure, end the process (or at
// least the group) before reusing such buffers.
//
// Cost per chunk: one device copy each side, their event waits, and one control message each
// way (about a microsecond through shared memory, tens over loopback TCP); with `slots` chunks in flight per peer, copies of later
// chunks overlap the control latency of earlier ones, so large messages pipeline.
//
// Direct exchanges (the one_shot collectives; transport/concepts.hpp, direct_transport), when
// `direct_bytes` is not 0: behind its FIFOs each rank's allocation holds two slots of
// direct_bytes, which its peers reach through the handle they opened for the FIFOs. A round k:
// the rank enqueues the copy of its block into its slot k % 2 and waits until it completed;
// then it sends every peer a `direct` record (round, bytes, agreed word, tag) and waits for
// every peer's record of round k. The peers then read its block where it lies (a device
// reads IPC-mapped memory directly): one copy and one control message per peer, where a
// message costs two copies and a message each way per chunk. The slot of round k is written
// again at round k + 2, which a rank enters only once every peer's record of round k + 1
// came: a peer sends that record once the copy it enqueued for round k + 1 completed, and so
// every read of round k's blocks it had enqueued before (one stream, in order).
//
// Exposures (two_shot, zero_copy; transport/concepts.hpp, exposing_transport), where the device exports a
// caller's memory: a round whose block is the caller's buffer itself. Its record goes on control
// tag 3 with the handle of the allocation holding the buffer and the offset in it. Once every
// rank's record came, each rank opens its peers' allocations, and the collective's closing slot
// round closes them after its reads completed, before its record leaves (CUDA IPC forbids
// freeing memory a peer has open; the caller may free its buffer once the collective returned).
// The round waits for this rank's earlier work before the record leaves, as a slot's round
// waits for its copy; a rank whose memory cannot be exported says so in its record, and the
// round's blocks are then empty on every rank, nothing opened.
// Registrations (registering_transport): a round of the kind whose record carries a
// registration number; the peers open the allocation then and keep it open, and the records of
// later exposures inside the registered buffer carry the number instead of a new export (the
// readers find the allocation among those they keep). A release closes what a rank kept, once
// its reads completed, before the slot round that ends it.
// A control channel delivers a peer's messages in the order they were sent, whatever their tag
// (a requirement of control_transport): an exposure record sent just before the peer's goodbye
// (a registration as its last operation) is read when the goodbye is, before the goodbye stops
// this rank listening, and a rendezvous record is there when its header is read.
//
// Set-up: the handles travel with each rank's layout (chunk, slots, direct_bytes); a rank whose
// layout differs would copy into the wrong place of its peers' memory, so every rank refuses
// to join it, naming the setting.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <chorus/detail/matching.hpp>

namespace chorus {

struct staged_config {
    /// Bytes per FIFO slot and slots per peer: up to `slots` chunks per peer are in flight.
    std::size_t chunk = std::size_t{1} << 21;
    std::size_t slots = 8;
    /// The largest block of a direct exchange (two slots of it per rank); 0: none, the
    /// transport then serves no one_shot collective. Every rank must agree on all three.
    std::size_t direct_bytes = 0;
    /// Messages to another rank of at least this many bytes are read by the receiver from the
    /// sender's buffer where it lies (rendezvous, above), where the device exports it; 0:
    /// never. Each rank decides for its own sends: the ranks need not agree.
    std::size_t rendezvous_bytes = 0;
    /// Signaled launches (signals.hpp: one_shot collectives run whole on the device, the ranks
    /// synchronising through flags in each other's memory), where the device runs them and
    /// direct_bytes is not 0; used only where every rank asks for them.
    bool signals = false;
};

namespace detail {

/// One isend or irecv of a staged engine.
struct staged_op : message_op {
    std::byte* in = nullptr;         // receive buffer
    std::byte const* out = nullptr;  // send buffer
    std::size_t enqueued = 0;        // send: bytes whose copy was enqueued
    std::size_t completed = 0;       // bytes whose copy completed
    bool routed = false;             // send: its way chosen (rendezvous, or chunks through the FIFO)
};

/// What the control channel carries: a chunk's header, credits, a direct round's record, a
/// rendezvous message's header and its delivery, or the goodbye.
struct staged_control {
    enum kind_t : std::uint64_t { chunk = 1, credit = 2, bye = 3, direct = 4, rendezvous = 5, delivered = 6 };
    std::uint64_t kind;
    std::uint64_t tag;
    std::uint64_t total;   // chunk, rendezvous: the message's size in bytes; direct: the block's
    std::uint64_t offset;  // chunk: its offset in the message (rendezvous: 0); direct: the round
    std::uint64_t length;  // chunk: its length (0 only for a zero-length message; rendezvous: the
                           // whole message); credit: slots freed
    std::uint64_t slot;    // chunk: the FIFO slot; direct: the agreed word; rendezvous and
                           // delivered: the message's number among the sender's rendezvous to the peer
};
static_assert(std::is_trivially_copyable_v<staged_control>);

} // namespace detail
} // namespace chorus
