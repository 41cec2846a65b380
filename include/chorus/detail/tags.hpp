// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// How collectives build message tags. A collective takes one tag for all its messages: the
// transport keeps messages of one (sender, tag) pair in order, and every pair of ranks agrees
// on the sequence of messages it exchanges within one collective, so one tag suffices.
//
//   bit 63      collective bit (user point-to-point tags stay below it)
//   bits 56-62  collective kind, so two ranks in different collectives are told apart
//   bits 36-55  the sub-group (group.hpp): 0 for the transport's own collectives
//   bits 0-35   the collective sequence number of the transport or sub-group
//
// A sub-group's messages travel over its parent's connections with the group's number in
// bits 36-55; its user point-to-point tags (below 2^36) get kind 0 (no collective).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <chorus/fwd.hpp>

namespace chorus::detail {

enum class collective_kind : std::uint8_t {
    barrier = 1,
    broadcast,
    scatter,
    gather,
    allgather,
    reduce,
    allreduce,
    reduce_scatter,
    alltoall,
    alltoallv,
    gatherv,
    scatterv,
    allgatherv,
    reduce_scatterv,
    scan,
    exscan,
    split,
    register_buffer,
    deregister_buffer,
};

inline constexpr char const* kind_name(collective_kind k) noexcept {
    switch (k) {
    case collective_kind::barrier: return "barrier";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::scatter: return "scatter";
    case collective_kind::gather: return "gather";
    case collective_kind::allgather: return "allgather";
    case collective_kind::reduce: return "reduce";
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::alltoall: return "alltoall";
    case collective_kind::alltoallv: return "alltoallv";
    case collective_kind::gatherv: return "gatherv";
    case collective_kind::scatterv: return "scatterv";
    case collective_kind::allgatherv: return "allgatherv";
    case collective_kind::reduce_scatterv: return "reduce_scatter";
    case collective_kind::scan: return "scan";
    case collective_kind::exscan: return "exscan";
    case collective_kind::split: return "split";
    case collective_kind::register_buffer: return "register_buffer";
    case collective_kind::deregister_buffer: return "deregister_buffer";
    }
    return "collective";
}

inline constexpr tag_t sequence_mask = (tag_t{1} << 56) - 1;
inline constexpr unsigned group_shift = 36;
inline constexpr tag_t group_sequence_mask = (tag_t{1} << group_shift) - 1;
inline constexpr std::uint64_t max_group_id = (std::uint64_t{1} << (56 - group_shift)) - 1;
// The two highest numbers are node_transport's own views of its ranks (transport/node.hpp):
// the ranks of one node, and the ranks of one local rank on every node (a rail). Groups of
// different nodes (rails) share a number but no rank, as the groups of one split do.
inline constexpr std::uint64_t node_local_group = max_group_id;
inline constexpr std::uint64_t node_rail_group = max_group_id - 1;
inline constexpr std::uint64_t max_user_group_id = max_group_id - 2;

constexpr tag_t make_collective_tag(collective_kind k, std::uint64_t sequence) noexcept {
    return collective_tag_bit | (tag_t{static_cast<std::uint8_t>(k)} << 56) | (sequence & sequence_mask);
}

constexpr bool is_collective_tag(tag_t t) noexcept { return (t & collective_tag_bit) != 0; }
constexpr std::uint64_t tag_sequence(tag_t t) noexcept { return t & sequence_mask; }
constexpr collective_kind tag_kind(tag_t t) noexcept {
    return static_cast<collective_kind>((t >> 56) & 0x7f);
}

/// Two tags that belong to the same collective call on both ranks but name different
/// collectives: the ranks disagree about which collective they are in.
/// (A sub-group's user tags, kind 0, belong to no collective.)
constexpr bool tags_conflict(tag_t posted, tag_t arrived) noexcept {
    return posted != arrived && is_collective_tag(posted) && is_collective_tag(arrived) &&
           static_cast<std::uint8_t>(tag_kind(posted)) != 0 && static_cast<std::uint8_t>(tag_kind(arrived)) != 0 &&
           tag_sequence(posted) == tag_sequence(arrived);
}

/// The sub-group a tag belongs to (0: the transport itself).
constexpr std::uint64_t tag_group(tag_t t) noexcept {
    return is_collective_tag(t) ? tag_sequence(t) >> group_shift : 0;
}

/// "allreduce #3", "allreduce #3 of group 2", "tag 17" or "tag 17 of group 2", for error messages.
inline std::string describe_tag(tag_t t) {
    if (!is_collective_tag(t)) return "tag " + std::to_string(t);
    std::uint64_t const group = tag_group(t);
    std::uint64_t const sequence = group ? tag_sequence(t) & group_sequence_mask : tag_sequence(t);
    std::string const of = group ? " of group " + std::to_string(group) : "";
    if (static_cast<std::uint8_t>(tag_kind(t)) == 0) return "tag " + std::to_string(sequence) + of;
    return std::string(kind_name(tag_kind(t))) + " #" + std::to_string(sequence) + of;
}

/// `text` with control characters escaped (\n, \x1b, ...): a reason that came from another
/// process is printed on this one's terminal and must not forge lines or escape sequences.
inline std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        auto const u = static_cast<unsigned char>(c);
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (u < 0x20 || u == 0x7f) {
            char const hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[u >> 4];
            out += hex[u & 15];
        } else {
            out += c;
        }
    }
    return out;
}

/// The error text of a peer rank outside the group; shared by the transports, as the texts below.
inline std::string peer_range_message(rank_t me, rank_t peer, rank_t size) {
    return "rank " + std::to_string(me) + ": peer " + std::to_string(peer) + " is out of range for a group of " +
           std::to_string(size) + " ranks";
}

/// The error text of a send or receive that did not complete within the transport's timeout.
inline std::string wait_timeout_message(rank_t me, long long timeout_ms, rank_t peer, bool is_send, tag_t tag) {
    return "rank " + std::to_string(me) + ": timed out after " + std::to_string(timeout_ms) + " ms waiting for rank " +
           std::to_string(peer) + " (" + (is_send ? "send of " : "receive of ") + describe_tag(tag) + ")";
}

/// "rank 2 left the group" (its transport was destroyed, or its connection closed after its
/// goodbye) while rank `me` `still` (what it still expected of it).
inline std::string left_message(rank_t me, rank_t peer, std::string const& still) {
    std::string const rank = "rank " + std::to_string(me);
    return rank + ": rank " + std::to_string(peer) + " left the group (its transport was destroyed) while " + rank + " " + still;
}

/// The reason a group fails when rank `me`'s transport is destroyed by an exception unwinding
/// the stack.
inline std::string left_by_exception_message(rank_t me) {
    return "rank " + std::to_string(me) + " left the group by an exception (its transport was destroyed while it unwound the stack)";
}

/// The reason a group fails when a request is destroyed before its operation completed.
inline std::string abandoned_message(rank_t me, bool is_send, tag_t tag, rank_t peer) {
    return "rank " + std::to_string(me) + " abandoned a pending " + (is_send ? "send of " : "receive of ") +
           describe_tag(tag) + (is_send ? " to rank " : " from rank ") + std::to_string(peer);
}

/// The error text of a message whose size differs from the receive posted for it; shared by
/// the transports so every one reports it the same way.
inline std::string size_mismatch_message(rank_t me, std::size_t got, rank_t src, tag_t tag, std::size_t posted) {
    return "rank " + std::to_string(me) + ": message of " + std::to_string(got) + " bytes from rank " +
           std::to_string(src) + " (" + describe_tag(tag) + ") does not match the " + std::to_string(posted) +
           "-byte receive posted for it";
}

/// Ranks that called one collective with sizes on either side of the one_shot limit, or with
/// different algorithms (one exposing, one sending messages): rank `me` exchanges directly
/// (`exchanging`) while `peer` sends it messages of `tag`, or the reverse.
inline std::string direct_mismatch_message(rank_t me, tag_t tag, rank_t peer, bool exchanging) {
    return "rank " + std::to_string(me) + (exchanging ? " exchanges " : " waits for messages of ") + describe_tag(tag) +
           " but rank " + std::to_string(peer) + (exchanging ? " sends it messages" : " exchanges it directly") +
           ": the ranks called it with different sizes, or run different algorithms of it (CHORUS_ALGO must agree)";
}

/// The error text when `src` sent a message of another collective than the one `me` is in.
inline std::string collective_mismatch_message(rank_t me, tag_t posted, rank_t src, tag_t arrived) {
    return "rank " + std::to_string(me) + " is in " + describe_tag(posted) + " but rank " + std::to_string(src) +
           " sent " + describe_tag(arrived) + ": the ranks called different collectives";
}

} // namespace chorus::detail
