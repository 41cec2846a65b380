// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_transport's engine: messages over the mesh of connections the rendezvous formed
// (rendezvous.hpp), in the frames of wire.hpp, matched by the core every transport shares
// (detail/matching.hpp).
//
// Progress, in the caller's thread. The sockets are non-blocking and no thread of ours runs:
// isend writes what the socket takes at once, and every wait() or test() drives all
// connections (ppoll, then sendmsg/recv) until its request completed. A handoff to an io
// thread costs two context switches per message, several times the loopback round trip of a
// small message; driving the sockets where the data is wanted costs none, and is what MPI
// implementations do. How one connection writes and reads: connection.hpp. An unexpected
// message is queued for its receive; when that receive is posted while the message is still
// arriving, the rest goes straight to the user's buffer. Because every wait drains every
// socket, a send completes whatever order the ranks post in: the progress rule holds for
// messages larger than the socket buffers (but, as in MPI, only while the receiving rank is
// inside some call of its transport).
//
// Waiting. A waiter spins on ppoll(0) + sched_yield for up to tcp_config::spin, then blocks in
// ppoll until its deadline: a blocked waiter on an idle host wakes up tens of microseconds
// late, and the yield hands the core to a rank that has work when there are more ranks than
// cores.
//
// Ownership. A buffer is touched only inside calls of the transport, and never after its
// request is gone: a request that gives up (timeout, failure, destruction) fails the group,
// which detaches every operation from its buffer (the unsent tail of a frame half written is
// copied, so the stream stays well-formed for the abort frame behind it; a payload half read
// is read on into nothing). One thread drives a transport at a time.
//
// Shutdown. Every peer gets a goodbye frame, and the engine reads until every peer's goodbye
// arrived (or the timeout passed): closing a socket with unread data resets the connection,
// which could destroy what was sent last (an abort frame). An EOF after a goodbye is not a
// failure; any other is, at that peer.

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include <poll.h>        // ppoll: waiting on every connection at once
#include <sched.h>       // sched_yield: spinning politely
#include <unistd.h>      // sysconf: the default CHORUS_MAX_MESSAGE_BYTES

#include <chorus/detail/matching.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/tcp/config.hpp>
#include <chorus/transport/tcp/connection.hpp>
#include <chorus/transport/tcp/interface.hpp>
#include <chorus/transport/tcp/wire.hpp>

namespace chorus::detail {

/// tcp_config::max_message_bytes, or by default half of this host's memory: an unexpected
/// message must be held in memory whole, and one larger than that could only end in swapping or
/// the OOM killer (a peer announcing 8 GiB must not get 8 GiB allocated).
inline std::size_t max_message_bytes(tcp_config const& cfg) noexcept {
    if (cfg.max_message_bytes) return cfg.max_message_bytes;
    long const pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return std::size_t{1} << 36;
    return static_cast<std::size_t>(pages) / 2 * static_cast<std::size_t>(page);
}

class tcp_socket_engine final : public tcp_engine {
    friend struct tcp_peer;  // calls begin_frame, end_frame and connection_error

public:
    /// Over the connected, handshaken `sockets` (by rank; null for this rank), whose
    /// io_context `io` the engine keeps alive as long as them.
    tcp_socket_engine(tcp_config const& cfg, std::unique_ptr<asio::io_context> io,
                      std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets)
        : me_(cfg.rank), timeout_(cfg.timeout), spin_(cfg.spin), max_message_(max_message_bytes(cfg)), io_(std::move(io)),
          peers_(sockets.size()), queues_(sockets.size()) {
        // Into peers_ first: if anything below throws, they are closed before their io_context.
        for (std::size_t q = 0; q < sockets.size(); ++q)
            if (sockets[q]) peers_[q] = std::make_unique<tcp_peer>(static_cast<rank_t>(q), std::move(*sockets[q]));
        for (auto& p : peers_) {
            asio::error_code ec;
            if (p) p->sock.non_blocking(true, ec);
            if (ec) throw transport_error(errc::connection_failed, p->rank, "rank " + std::to_string(me_) + ": " + ec.message());
        }
    }
    tcp_socket_engine(tcp_socket_engine const&) = delete;
    tcp_socket_engine& operator=(tcp_socket_engine const&) = delete;
    ~tcp_socket_engine() override { shutdown(); }

    std::shared_ptr<tcp_op> isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) override {
        check_peer(me_, peer, size());
        failure_.throw_if_failed(me_);
        if (peer == me_) {  // to self: no socket, eager copy
            arrived(peer, tag, heap_bytes::copy_of(bytes));
            return nullptr;
        }
        auto op = make_op<tcp_op>(true, peer, tag, bytes.size());
        op->out = bytes.data();
        tcp_peer& p = peer_at(peer);
        if (p.finished) {
            op->fail(errc::peer_failed, "rank " + std::to_string(me_) + ": cannot send to rank " + std::to_string(peer) +
                                            ", whose connection is closed");
            return op;
        }
        tcp_frame& f = p.out.emplace_back();
        tcp_wire::encode(f.header.data(), {tcp_wire::frame_data, tag, bytes.size()});
        f.size = bytes.size();
        f.op = op;
        if (p.out.size() == 1) p.pump_write(*this);  // the message leaves now, not at the next wait
        if (op->done && !op->failed()) return nullptr;
        return op;
    }

    std::shared_ptr<tcp_op> irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) override {
        check_peer(me_, peer, size());
        auto op = make_op<tcp_op>(false, peer, tag, bytes.size());
        op->in = bytes.data();
        failure_.throw_if_failed(me_);
        auto& queue = queue_of(peer);
        auto const it = queue.find_message(*op, me_);
        if (op->done) return op;  // a message of another collective failed it
        if (it != queue.messages().end()) {
            deliver(*op, it->bytes.span());
            queue.messages().erase(it);
        } else if (peer == me_ || !take_over(peer_at(peer), op)) {
            queue.post(op);
        }
        return op;
    }

    void wait(std::shared_ptr<tcp_op> const& op) override {
        bool const finished = progress(clock::now() + timeout_, [&] { return op->done; });
        if (!op->done) {
            queue_of(op->peer).unpost(*op);
            if (finished) failure_.throw_if_failed(me_);  // the group failed while we waited
        }
        conclude_wait(*op, me_, timeout_, [&](std::string const& what) { fail_group(me_, what); });
    }

    bool test(std::shared_ptr<tcp_op> const& op) override {
        if (!op->done && !failure_.failed()) poll_once(0);
        fail_if_oversize();
        if (!op->done && !failure_.failed()) return false;
        wait(op);  // done or failed: returns or throws at once
        return true;
    }

    /// A request destroyed before it completed.
    void cancel(std::shared_ptr<tcp_op> const& op) noexcept override {
        if (op->done) return;
        queue_of(op->peer).unpost(*op);
        fail_group(me_, abandoned_message(me_, op->is_send, op->tag, op->peer));
    }

    void abort(std::string const& reason) noexcept override { fail_group(me_, reason); }

private:
    using clock = std::chrono::steady_clock;
    using queue_t = match_queue<tcp_op, tcp_message>;
    static constexpr std::size_t max_control_bytes = 1 << 20;  // an abort reason

    rank_t size() const noexcept { return static_cast<rank_t>(peers_.size()); }
    tcp_peer& peer_at(rank_t r) noexcept { return *peers_[static_cast<std::size_t>(r)]; }
    queue_t& queue_of(rank_t r) noexcept { return queues_[static_cast<std::size_t>(r)]; }

    // ---- matching --------------------------------------------------------------------------

    void deliver(tcp_op& op, std::span<std::byte const> bytes) {
        if (!check_size(op, me_, bytes.size())) return;
        if (!bytes.empty()) std::memcpy(op.in, bytes.data(), bytes.size());
        op.done = true;
    }

    // A whole message from src: into the oldest receive posted for it, else queued.
    void arrived(rank_t src, tag_t tag, heap_bytes bytes) {
        if (auto r = queue_of(src).take_receive(me_, src, tag)) return deliver(*r, bytes.span());
        queue_of(src).messages().push_back({tag, std::move(bytes)});
    }

    // The message `op` wants may be arriving right now into a heap buffer (no receive was
    // posted when its header came): take it over, so that the rest lands in the user's buffer.
    bool take_over(tcp_peer& p, std::shared_ptr<tcp_op> const& op) {
        if (!p.in_frame || p.in_op || p.in_discard || p.in_type != tcp_wire::frame_data || p.in_tag != op->tag ||
            p.in_size != op->size || queue_of(p.rank).has_receive_for(op->tag))
            return false;
        if (p.in_got) std::memcpy(op->in, p.in_heap.data.get(), p.in_got);
        p.in_heap = {};
        p.in_op = op;
        return true;
    }

    // ---- failure ---------------------------------------------------------------------------

    // Marks the group failed on behalf of `who` (first reason kept) and detaches every
    // operation from its buffer. When this rank is the one failing, every peer gets an abort
    // frame, flushed before returning (the caller is about to throw, and maybe to exit).
    void fail_group(rank_t who, std::string const& reason) noexcept {
        if (!failure_.set(who, reason)) return;
        for (auto& q : queues_) q.drop_receives();
        for (auto& p : peers_) {
            if (!p) continue;
            detach_buffers(*p);
            if (who == me_ && !p->finished) queue_control(*p, tcp_wire::frame_abort, reason);
        }
        if (who == me_ && !flushing_) flush(clock::now() + std::min(timeout_, std::chrono::milliseconds(2000)));
    }

    // A peer sent more than max_message_ before its receive was posted (see begin_frame).
    void fail_if_oversize() noexcept {
        if (!oversize_.empty()) fail_group(me_, std::exchange(oversize_, {}));
    }

    // Sends not started are dropped (control frames stay: a goodbye must still go out); a
    // frame half written keeps a copy of its tail; a payload arriving is read into nothing.
    void detach_buffers(tcp_peer& p) noexcept {
        if (p.in_frame && p.in_type == tcp_wire::frame_data) {
            p.in_op.reset();
            p.in_heap = {};
            p.in_discard = true;
        }
        std::erase_if(p.out, [](tcp_frame const& f) { return f.op && f.sent == 0; });
        if (p.out.empty() || !p.out.front().op) return;
        tcp_frame& f = p.out.front();
        std::size_t const from = f.sent > tcp_wire::header_size ? f.sent - tcp_wire::header_size : 0;
        try {
            f.owned.assign(f.op->out + from, f.op->out + f.size);
            f.skip = from;
            f.op.reset();
        } catch (...) {  // no memory for the tail: the stream cannot be kept whole
            close_peer(p);
        }
    }

    // Queues a frame that owns its payload (an abort reason; empty for a goodbye).
    static void queue_control(tcp_peer& p, std::uint64_t type, std::string const& payload) noexcept {
        try {
            tcp_frame& f = p.out.emplace_back();
            tcp_wire::encode(f.header.data(), {type, 0, payload.size()});
            f.owned.assign(reinterpret_cast<std::byte const*>(payload.data()),
                           reinterpret_cast<std::byte const*>(payload.data()) + payload.size());
            f.size = payload.size();
        } catch (...) {  // the peer will see the connection close instead
        }
    }

    // Writes what is queued, reading (and, the group having failed, discarding) meanwhile so
    // that a peer writing to us can progress to reading our frames.
    void flush(clock::time_point deadline) noexcept {
        flushing_ = true;
        try {
            progress(deadline, [&] {
                return std::ranges::all_of(peers_, [](auto const& p) { return !p || p->finished || p->out.empty(); });
            });
        } catch (...) {
        }
        flushing_ = false;
    }

    void close_peer(tcp_peer& p) noexcept {
        p.finished = true;
        asio::error_code ec;
        p.sock.close(ec);
    }

    // The connection ended or broke. After the peer's goodbye (or during our shutdown) that is
    // expected; otherwise the group failed at that peer.
    void connection_error(tcp_peer& p, std::string const& why) {
        bool const expected = p.goodbye_in || shut_;
        std::string const lost = "rank " + std::to_string(me_) + ": connection to rank " + std::to_string(p.rank);
        p.finished = true;
        for (auto& f : p.out)
            if (f.op) f.op->fail(errc::peer_failed, lost + " closed before a send completed: " + why);
        p.out.clear();
        if (p.in_op) std::exchange(p.in_op, nullptr)->fail(errc::peer_failed, lost + " closed during a receive: " + why);
        p.in_frame = false;
        if (!expected) fail_group(p.rank, "connection to rank " + std::to_string(p.rank) + " lost: " + why);
    }

    void shutdown() noexcept {
        bool any = false;
        for (auto& p : peers_)
            if (p && !p->finished) {
                queue_control(*p, tcp_wire::frame_goodbye, {});
                any = true;
            }
        if (any) {
            flushing_ = true;
            try {
                progress(clock::now() + timeout_, [&] {
                    return std::ranges::all_of(peers_, [](auto const& p) {
                        return !p || p->finished || (p->out.empty() && p->goodbye_in);
                    });
                });
            } catch (...) {
            }
        }
        shut_ = true;
        for (auto& p : peers_) {
            if (!p) continue;
            asio::error_code ec;
            p->sock.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
            p->sock.close(ec);
        }
    }

    // ---- progress --------------------------------------------------------------------------

    // Drives every connection until done() (true), the group failed (true) or the deadline
    // passed (false).
    template <class Done>
    bool progress(clock::time_point deadline, Done const& done) {
        auto const spin_until = clock::now() + spin_;
        for (;;) {
            fail_if_oversize();
            if (done()) return true;
            if (failure_.failed() && !flushing_) return true;
            auto const now = clock::now();
            if (now >= deadline) return false;
            if (now < spin_until) {
                poll_once(0);
                ::sched_yield();  // a rank of this host that is runnable on our core goes first
            } else {
                poll_once(std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count());
            }
        }
    }

    // One ppoll over every open connection (readable; writable where frames are queued), with
    // a timeout in ns, then reads and writes on the ready ones.
    void poll_once(long long timeout_ns) {
        fds_.clear();
        ready_.clear();
        for (auto& p : peers_) {
            if (!p || p->finished) continue;
            fds_.push_back({p->sock.native_handle(), static_cast<short>(POLLIN | (p->out.empty() ? 0 : POLLOUT)), 0});
            ready_.push_back(p.get());
        }
        timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
        if (::ppoll(fds_.data(), fds_.size(), &ts, nullptr) <= 0) return;  // timeout, or EINTR: the caller loops
        for (std::size_t i = 0; i < fds_.size(); ++i) {
            short const ev = fds_[i].revents;
            if (ev & (POLLOUT | POLLERR)) ready_[i]->pump_write(*this);
            if (ev & (POLLIN | POLLHUP | POLLERR)) ready_[i]->pump_read(*this);
        }
    }

    // A header is in staging: decide where its payload goes.
    void begin_frame(tcp_peer& p) {
        auto const h = tcp_wire::decode_frame(reinterpret_cast<unsigned char const*>(p.staging.data() + p.begin));
        p.begin += tcp_wire::header_size;
        if (h.type == tcp_wire::frame_goodbye && h.size == 0) {
            p.goodbye_in = true;
            return;
        }
        if ((h.type != tcp_wire::frame_data && h.type != tcp_wire::frame_abort) ||
            (h.type == tcp_wire::frame_abort && h.size > max_control_bytes))
            return connection_error(p, "malformed frame");
        p.in_frame = true;
        p.in_type = h.type;
        p.in_tag = h.tag;
        p.in_size = static_cast<std::size_t>(h.size);
        p.in_got = 0;
        p.in_discard = false;
        if (h.type == tcp_wire::frame_data) {
            if (failure_.failed()) {
                p.in_discard = true;
                return;
            }
            // The oldest receive posted for it takes it directly; one of another size fails,
            // and the message is read into nothing.
            if (auto r = queue_of(p.rank).take_receive(me_, p.rank, h.tag)) {
                if (check_size(*r, me_, p.in_size)) p.in_op = std::move(r);
                else p.in_discard = true;
                return;
            }
        }
        if (h.type == tcp_wire::frame_data && p.in_size > max_message_) {  // before allocating anything
            // Read into nothing; the group fails once this read is over (fail_group drives the
            // sockets itself, which it must not do from inside a read).
            p.in_discard = true;
            if (oversize_.empty())
                oversize_ = "rank " + std::to_string(me_) + ": rank " + std::to_string(p.rank) + " sent a message of " +
                            std::to_string(h.size) + " bytes (" + describe_tag(h.tag) +
                            ") before its receive was posted, more than CHORUS_MAX_MESSAGE_BYTES = " +
                            std::to_string(max_message_);
            return;
        }
        try {
            p.in_heap = heap_bytes::make(p.in_size);
        } catch (...) {
            p.in_frame = false;
            connection_error(p, "out of memory for a message of " + std::to_string(h.size) + " bytes");
        }
    }

    void end_frame(tcp_peer& p) {
        p.in_frame = false;
        if (p.in_op) {
            std::exchange(p.in_op, nullptr)->done = true;
        } else if (p.in_discard) {
            p.in_discard = false;
        } else if (p.in_type == tcp_wire::frame_abort) {
            heap_bytes const bytes = std::exchange(p.in_heap, {});
            fail_group(p.rank, printable(std::string_view(reinterpret_cast<char const*>(bytes.data.get()), bytes.size)));
        } else {
            arrived(p.rank, p.in_tag, std::exchange(p.in_heap, {}));
        }
    }

    rank_t me_;
    std::chrono::milliseconds timeout_;
    std::chrono::microseconds spin_;
    std::size_t max_message_;  // the largest message accepted before its receive is posted
    // io_ first: sockets (in peers_) must be destroyed before their io_context.
    std::unique_ptr<asio::io_context> io_;
    std::vector<std::unique_ptr<tcp_peer>> peers_;  // null for self
    std::vector<queue_t> queues_;                   // by sender
    std::vector<pollfd> fds_;      // poll_once's scratch, kept to avoid an allocation per wait
    std::vector<tcp_peer*> ready_;
    group_failure failure_;
    std::string oversize_;   // why the group is to fail, found inside a read (begin_frame)
    bool flushing_ = false;  // flush() or shutdown() drive the sockets of a failed group
    bool shut_ = false;
};

} // namespace chorus::detail
