// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The matching core of every transport: how a message finds its receive, how a mismatch is
// told, how a group failure and a wait that ran out end. Written once and used by the
// loopback (threads), TCP (sockets) and staged (device FIFOs) engines, so that they match,
// check and fail alike and say so in the same words (tags.hpp has the texts).
//
// Per sender, a match_queue holds the receives posted for it, in posting order, and the
// messages that arrived before their receive, in arrival order. An arriving message goes to
// the oldest receive posted with its tag; a new receive takes the oldest queued message with
// its tag. One sender's messages of one tag arrive in the order they were sent, so this is
// the transport concept's ordering rule. Two collective tags of one sequence number but of
// different kinds mean the ranks called different collectives: the receive fails
// (errc::tag_mismatch, naming both) and the message stays queued, as nothing else may take
// it. A message whose size differs from its receive's fails that receive (errc::size_mismatch)
// and is dropped: there is no buffer it could go to.
//
// The engines differ in how bytes move (a memcpy, a socket, device copies of chunks) and in
// how they wait (a condition variable, ppoll, polling events), so those stay theirs; what
// they share is here. A match_queue is not synchronised: its engine's lock (loopback) or
// single driving thread (TCP, staged) protects it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include <unistd.h>  // write: report_blame

#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail {

/// What every engine's send or receive has: its peer, tag and size, and how it ended.
struct message_op {
    bool is_send = false;
    rank_t peer = 0;        // the rank it goes to or comes from
    tag_t tag = 0;
    std::size_t size = 0;   // bytes of its buffer
    bool posted = false;    // a receive waiting in its match_queue
    bool done = false;      // completed, or failed
    errc error{};           // errc{}: no error
    std::string message;    // the error's text

    void fail(errc e, std::string text) {
        error = e;
        message = std::move(text);
        done = true;
    }
    bool failed() const noexcept { return error != errc{}; }
};

/// A new operation of an engine whose ops derive from message_op.
template <class Op>
std::shared_ptr<Op> make_op(bool is_send, rank_t peer, tag_t tag, std::size_t size) {
    auto op = std::make_shared<Op>();
    op->is_send = is_send;
    op->peer = peer;
    op->tag = tag;
    op->size = size;
    return op;
}

/// Whether a message of `got` bytes fits `op`; if not, fails it with the shared text.
inline bool check_size(message_op& op, rank_t me, std::size_t got) {
    if (got == op.size) return true;
    op.fail(errc::size_mismatch, size_mismatch_message(me, got, op.peer, op.tag, op.size));
    return false;
}

/// Throws invalid_argument unless `peer` is a rank of a group of `size`.
inline void check_peer(rank_t me, rank_t peer, rank_t size) {
    if (peer < 0 || peer >= size) throw invalid_argument(peer_range_message(me, peer, size));
}

// A queued message's tag: messages are held by value or by pointer.
template <class M>
tag_t message_tag(M const& m) noexcept {
    if constexpr (requires { m->tag; }) return m->tag;
    else return m.tag;
}

/// The receives posted for one sender and the messages that arrived from it unasked.
/// `Op` derives from message_op; `Message` (or what it points to) has a `tag`.
template <class Op, class Message>
class match_queue {
public:
    using op_ptr = std::shared_ptr<Op>;
    using message_iterator = typename std::deque<Message>::iterator;

    std::deque<Message>& messages() noexcept { return messages_; }

    void post(op_ptr op) {
        op->posted = true;
        receives_.push_back(std::move(op));
    }

    /// Takes a receive back (it gave up, or its request is gone).
    void unpost(Op& op) noexcept {
        if (!op.posted) return;
        std::erase_if(receives_, [&](op_ptr const& r) { return r.get() == &op; });
        op.posted = false;
    }

    bool has_receives() const noexcept { return !receives_.empty(); }

    /// The group failed: no receive waits for a message any more.
    void drop_receives() noexcept {
        for (auto& r : receives_) r->posted = false;
        receives_.clear();
    }

    /// A message of `tag` from `src` arrives at rank `me`: the oldest receive posted for it,
    /// taken off the queue, or null (the message is unexpected). A receive of another
    /// collective at the same sequence number fails on the way; the message then stays
    /// unexpected.
    op_ptr take_receive(rank_t me, rank_t src, tag_t tag) {
        for (auto it = receives_.begin(); it != receives_.end(); ++it) {
            Op& r = **it;
            if (r.tag == tag) {
                op_ptr found = std::move(*it);
                receives_.erase(it);
                found->posted = false;
                return found;
            }
            if (tags_conflict(r.tag, tag)) {
                r.posted = false;
                r.fail(errc::tag_mismatch, collective_mismatch_message(me, r.tag, src, tag));
                receives_.erase(it);
                return nullptr;
            }
        }
        return nullptr;
    }

    /// Whether a message of `tag` would meet a posted receive (to take it, or to fail it).
    bool has_receive_for(tag_t tag) const noexcept {
        return std::ranges::any_of(receives_, [&](op_ptr const& r) { return r->tag == tag || tags_conflict(r->tag, tag); });
    }

    /// Receive `op` is being posted at rank `me`: the oldest queued message of its tag, or
    /// messages().end() — also when a message of another collective at the same sequence
    /// number failed `op` (then op.done). `skip(m)` passes over messages that are spoken for.
    template <class Skip>
    message_iterator find_message(Op& op, rank_t me, Skip const& skip) {
        for (auto it = messages_.begin(); it != messages_.end(); ++it) {
            if (skip(*it)) continue;
            tag_t const tag = message_tag(*it);
            if (tag == op.tag) return it;
            if (tags_conflict(op.tag, tag)) {
                op.fail(errc::tag_mismatch, collective_mismatch_message(me, op.tag, op.peer, tag));
                return messages_.end();
            }
        }
        return messages_.end();
    }
    message_iterator find_message(Op& op, rank_t me) {
        return find_message(op, me, [](Message const&) { return false; });
    }

private:
    std::deque<op_ptr> receives_;
    std::deque<Message> messages_;
};

/// Why and where a group failed: the first reason is kept.
class group_failure {
public:
    bool failed() const noexcept { return rank_ >= 0; }
    /// The rank the failure is blamed on, and why (once failed()).
    rank_t blamed() const noexcept { return rank_; }
    std::string const& reason() const noexcept { return reason_; }

    /// Records the failure unless one is recorded already; returns whether this call did.
    bool set(rank_t who, std::string const& reason) noexcept {
        if (failed()) return false;
        rank_ = who;
        try {
            reason_ = reason;
        } catch (...) {  // no memory for the text: the failure itself is recorded
        }
        return true;
    }

    /// Throws what an operation of rank `me` fails with once the group failed.
    void throw_if_failed(rank_t me) const {
        if (!failed()) return;
        if (rank_ == me)
            throw transport_error(errc::aborted, me, "rank " + std::to_string(me) + " aborted earlier: " + reason_);
        throw transport_error(errc::peer_failed, rank_,
                              "rank " + std::to_string(me) + ": the group failed at rank " + std::to_string(rank_) +
                                  ": " + reason_);
    }

private:
    rank_t rank_ = -1;
    std::string reason_;
};

/// Tells the launcher (CHORUS_BLAME_FD, a pipe chorusrun reads; see tcp_config::blame_fd) whom rank `me` blames for
/// its group's failure. One write of a short line: lines of different ranks do not mix.
inline void report_blame(int fd, rank_t me, rank_t blame) noexcept {
    if (fd < 0 || blame < 0) return;
    char line[64];
    int const n = std::snprintf(line, sizeof line, "chorus-blame %d %d\n", me, blame);
    [[maybe_unused]] ssize_t const written = ::write(fd, line, static_cast<std::size_t>(n));
}

/// When a wait of `timeout` that starts now ends; a timeout of 0 means none (ten years).
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) noexcept {
    auto const now = std::chrono::steady_clock::now();
    return now + (timeout.count() > 0 ? timeout : std::chrono::milliseconds(std::chrono::hours(24 * 3650)));
}

/// The end of a wait of rank `me` on `op` (the engine has handled a group failure first):
/// returns if `op` completed; otherwise fails the group through `abort(text)` and throws the
/// op's error or, if it is still pending, a timeout naming the peer (`hint` appended).
template <class Abort>
void conclude_wait(message_op const& op, rank_t me, std::chrono::milliseconds timeout, Abort const& abort,
                   std::string const& hint = {}) {
    if (op.done && !op.failed()) return;
    if (op.done) {
        std::string const what = op.message;
        abort(what);
        throw transport_error(op.error, op.peer, what);
    }
    std::string const what = wait_timeout_message(me, timeout.count(), op.peer, op.is_send, op.tag) + hint;
    abort(what);
    throw timeout_error(op.peer, what);
}

} // namespace chorus::detail
