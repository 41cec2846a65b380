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
// Liveness. A thread of the engine sends a heartbeat frame on every connection each
// tcp_config::heartbeat, whatever the owning thread is doing (computing between collectives
// included), so that a waiting rank that hears nothing at all from a peer for five heartbeats
// knows it is stopped (SIGSTOP, a debugger), stuck, or that its host is unreachable, and
// fails the group naming it — also with no collective timeout (CHORUS_TIMEOUT_MS=0). Only
// while the peer is between frames: a peer that left a frame half written to us (an isend
// whose rest goes out at its next wait) cannot send heartbeats on that connection, and its
// silence proves nothing; the kernel's keepalive and TCP_USER_TIMEOUT cover that case. A
// wait that times out blames a peer silent for two heartbeats over the one it waited for,
// which is often alive and itself waiting behind the silent one.
//
// Blame. Every abort frame carries the rank it blames, so the whole group names the rank
// that failed (died, stopped, left), not the first rank that noticed.
//
// Shutdown. Every peer gets a goodbye frame, then the end of our stream; a peer that reads a
// goodbye fails what it still waits for from us ("rank N left the group") instead of timing
// out. The engine then waits until the peers' hosts acknowledged every byte it sent (closing
// a socket with unread input resets the connection, and a reset discards what the peer's host
// has not acknowledged yet), reading meanwhile, and closes: it never waits for a peer's
// goodbye, so a rank that leaves early or after a failure is gone within a fraction of a
// second (after a failure: at most exit_grace). An EOF after a goodbye is not a failure; any
// other is, at that peer.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include <linux/sockios.h>  // SIOCOUTQ: bytes the peer's host has not acknowledged
#include <netinet/in.h>
#include <netinet/tcp.h>     // keepalive and TCP_USER_TIMEOUT: the kernel's liveness backstop
#include <poll.h>            // ppoll: waiting on every connection at once
#include <sched.h>           // sched_yield: spinning politely
#include <sys/ioctl.h>
#include <unistd.h>          // sysconf: the default CHORUS_MAX_MESSAGE_BYTES

#include <chorus/detail/companion.hpp>
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

/// The kernel's side of liveness, for what heartbeats cannot see (a peer silent in the middle
/// of a frame): keepalive probes on an idle connection, and TCP_USER_TIMEOUT for data the
/// peer's host never acknowledges. Generous, as a backstop: the heartbeats are the detector.
inline void set_keepalive(int fd, std::chrono::milliseconds heartbeat, std::chrono::milliseconds silence) noexcept {
    auto const seconds = [](std::chrono::milliseconds d) { return static_cast<int>(std::max<long long>(1, d.count() / 1000)); };
    int const on = 1, idle = seconds(silence), interval = seconds(heartbeat), count = 3;
    unsigned const user_timeout = static_cast<unsigned>(std::max<long long>(6 * silence.count(), 30000));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

class tcp_socket_engine final : public tcp_engine {
    friend struct tcp_peer;  // calls begin_frame, end_frame and connection_error

public:
    /// Over the connected, handshaken `sockets` (by rank; null for this rank), whose
    /// io_context `io` the engine keeps alive as long as them.
    tcp_socket_engine(tcp_config const& cfg, std::unique_ptr<asio::io_context> io,
                      std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets)
        : me_(cfg.rank), timeout_(cfg.timeout), setup_(setup_timeout(cfg)), heartbeat_(cfg.heartbeat), spin_(cfg.spin),
          max_message_(max_message_bytes(cfg)), max_unexpected_(cfg.max_unexpected_bytes), blame_fd_(cfg.blame_fd), io_(std::move(io)), peers_(sockets.size()), queues_(sockets.size()) {
        // Into peers_ first: if anything below throws, they are closed before their io_context.
        for (std::size_t q = 0; q < sockets.size(); ++q)
            if (sockets[q]) peers_[q] = std::make_unique<tcp_peer>(static_cast<rank_t>(q), std::move(*sockets[q]), stats_);
        for (auto& p : peers_) {
            asio::error_code ec;
            if (p) p->sock.non_blocking(true, ec);
            if (ec) throw transport_error(errc::connection_failed, p->rank, "rank " + std::to_string(me_) + ": " + ec.message());
            if (p && beating()) set_keepalive(p->sock.native_handle(), heartbeat_, silence_limit());
        }
        next_check_ = clock::now();
        for (auto& p : peers_)
            if (p) p->heard_at = next_check_;
        if (beating() && peers_.size() > 1) beat_thread_ = std::thread([this] { beat(); });
    }
    tcp_socket_engine(tcp_socket_engine const&) = delete;
    tcp_socket_engine& operator=(tcp_socket_engine const&) = delete;
    ~tcp_socket_engine() override { shutdown(); }

    std::shared_ptr<tcp_op> isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) override {
        check_peer(me_, peer, size());
        failure_.throw_if_failed(me_);
        if (peer == me_) {  // to self: no socket, eager copy
            unexpected_ += bytes.size();
            arrived(peer, tag, heap_bytes::copy_of(bytes));
            return nullptr;
        }
        auto op = make_op<tcp_op>(true, peer, tag, bytes.size());
        op->out = bytes.data();
        tcp_peer& p = peer_at(peer);
        if (p.goodbye_in) {
            fail_group(peer, left_message(me_, peer, "was sending to it (" + describe_tag(tag) + ")"));
            failure_.throw_if_failed(me_);
        }
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
            unexpected_ -= it->bytes.size();
            deliver(*op, it->bytes.span());
            queue.messages().erase(it);
        } else if (peer != me_ && peer_at(peer).goodbye_in && !peer_at(peer).in_frame) {
            fail_group(peer, left_message(me_, peer, "waited for a message from it (" + describe_tag(tag) + ")"));
            failure_.throw_if_failed(me_);
        } else if (peer == me_ || !take_over(peer_at(peer), op)) {
            queue.post(op);
        }
        return op;
    }

    void wait(std::shared_ptr<tcp_op> const& op) override {
        bool const finished = progress(deadline_after(timeout_), [&] { return op->done; });
        if (!op->done) {
            queue_of(op->peer).unpost(*op);
            if (finished) failure_.throw_if_failed(me_);  // the group failed while we waited
            if (auto const cause = likelier_cause()) {
                fail_group(cause->first,
                           wait_timeout_message(me_, timeout_.count(), op->peer, op->is_send, op->tag) + "; " + cause->second);
                failure_.throw_if_failed(me_);
            }
        }
        conclude_wait(*op, me_, timeout_, [&](std::string const& what) { fail_group(me_, what); });
    }

    bool test(std::shared_ptr<tcp_op> const& op) override {
        if (!op->done && !failure_.failed()) {
            poll_once(0);
            check_liveness(clock::now());
            if (companion_ && !op->done) companion_->poke();
        }
        fail_if_pending();
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
    tcp_stats stats() const noexcept override { return stats_; }

    void set_companion(companion* c) noexcept override { companion_ = c; }
    void drive() override {
        fail_if_pending();
        if (failure_.failed()) return;
        poll_once(0);
        check_liveness(clock::now());
        fail_if_pending();  // what this round found, for the owner to spread now
    }
    bool busy() const noexcept override {
        for (auto const& p : peers_)
            if (p && (!p->out.empty() || p->in_frame)) return true;
        for (auto const& q : queues_)
            if (q.has_receives()) return true;
        return false;
    }
    bool failure(rank_t& blamed, std::string& reason) const override {
        if (!failure_.failed()) return false;
        blamed = failure_.blamed();
        reason = failure_.reason();
        return true;
    }
    void fail(rank_t blamed, std::string const& reason) noexcept override { fail_group(blamed, reason); }

private:
    using clock = std::chrono::steady_clock;
    using queue_t = match_queue<tcp_op, tcp_message>;
    static constexpr std::size_t max_control_bytes = 1 << 20;  // an abort reason
    // The largest unsent tail of a half-written message that a failure copies to keep the
    // stream whole for the abort frame behind it; past it the connection is closed instead
    // (the peer then learns of the failure from the end of the stream and the other ranks).
    static constexpr std::size_t max_detached_tail = std::size_t{64} << 20;
    // After a failure, how long the abort frames and the shutdown may take: the process can
    // exit within a second of the failure.
    static constexpr std::chrono::milliseconds exit_grace{500};

    rank_t size() const noexcept { return static_cast<rank_t>(peers_.size()); }
    tcp_peer& peer_at(rank_t r) noexcept { return *peers_[static_cast<std::size_t>(r)]; }
    queue_t& queue_of(rank_t r) noexcept { return queues_[static_cast<std::size_t>(r)]; }

    // ---- matching --------------------------------------------------------------------------

    void deliver(tcp_op& op, std::span<std::byte const> bytes) {
        if (!check_size(op, me_, bytes.size())) return;
        if (!bytes.empty()) std::memcpy(op.in, bytes.data(), bytes.size());
        op.done = true;
    }

    // A whole message from src, held (counted in unexpected_): into the oldest receive posted
    // for it, else queued.
    void arrived(rank_t src, tag_t tag, heap_bytes bytes) {
        if (auto r = queue_of(src).take_receive(me_, src, tag)) {
            unexpected_ -= bytes.size();
            return deliver(*r, bytes.span());
        }
        queue_of(src).messages().push_back({tag, std::move(bytes)});
    }

    // The message `op` wants may be arriving right now into a heap buffer, or be parked (no
    // receive was posted when its header came): take it over, so that the rest lands in the
    // user's buffer. A parked message of another size fails `op` and is read into nothing; one
    // of another collective at the same sequence number fails `op` and stays.
    bool take_over(tcp_peer& p, std::shared_ptr<tcp_op> const& op) {
        if (!p.in_frame || p.in_op || p.in_discard || p.in_type != tcp_wire::frame_data ||
            queue_of(p.rank).has_receive_for(op->tag))
            return false;
        if (p.parked && tags_conflict(op->tag, p.in_tag)) {
            op->fail(errc::tag_mismatch, collective_mismatch_message(me_, op->tag, p.rank, p.in_tag));
            return true;
        }
        if (p.in_tag != op->tag) return false;
        if (p.parked && !check_size(*op, me_, p.in_size)) {
            p.in_discard = true;
        } else if (p.in_size != op->size) {
            return false;
        } else {
            if (p.in_got) std::memcpy(op->in, p.in_heap.data(), p.in_got);
            if (!p.parked) {
                unexpected_ -= p.in_size;
                stats_.bytes_unexpected -= p.in_size - p.in_got;  // the rest goes straight in
            }
            p.in_heap = {};
            p.in_op = op;
        }
        if (std::exchange(p.parked, false)) p.pump_read(*this);  // its bytes may be staged already
        return true;
    }

    // A wait timed out: a message nobody took that holds back what its sender sent after it
    // (parked, see begin_frame), or a peer silent for two heartbeats, is the likelier cause
    // than the peer waited for, which may well wait behind it. The rank to blame, and why.
    std::optional<std::pair<rank_t, std::string>> likelier_cause() const {
        for (auto const& p : peers_)
            if (p && p->parked)
                return std::pair{p->rank, "rank " + std::to_string(p->rank) + " sent a message of " + std::to_string(p->in_size) +
                                              " bytes (" + describe_tag(p->in_tag) +
                                              ") that no receive took, which holds back what it sent after it "
                                              "(CHORUS_MAX_UNEXPECTED_BYTES = " + std::to_string(max_unexpected_) + ")"};
        if (auto const s = silent_peer(clock::now(), 2 * heartbeat_)) return std::pair{s->first, silence_message(s->first, s->second)};
        return std::nullopt;
    }

    // ---- failure ---------------------------------------------------------------------------

    // Marks the group failed, blaming `blame` (first reason kept), and detaches every operation
    // from its buffer. A failure found here (`spread`) is told to every peer in an abort frame
    // that names `blame`, flushed before returning (the caller is about to throw, maybe to
    // exit); one an abort frame told us is not told on: its sender told everyone.
    void fail_group(rank_t blame, std::string const& reason, bool spread = true) noexcept {
        if (!failure_.set(blame, reason)) return;
        failed_at_ = clock::now();
        told_ = spread;
        report_blame(blame_fd_, me_, blame);
        for (auto& q : queues_) q.drop_receives();
        for (auto& p : peers_) {
            if (!p) continue;
            detach_buffers(*p);
            if (spread && !p->finished) queue_control(*p, tcp_wire::frame_abort, reason, blame);
        }
        if (spread && !flushing_) flush(clock::now() + std::min(setup_, exit_grace));
    }

    // A failure found inside a read (begin_frame, connection_error), where fail_group must not
    // drive the sockets: it happens once the read is over.
    void defer_failure(rank_t blame, std::string reason) {
        if (!pending_) pending_.emplace(blame, std::move(reason));
    }
    void fail_if_pending() noexcept {
        if (!pending_) return;
        auto const failure = std::move(*pending_);
        pending_.reset();
        fail_group(failure.first, failure.second);
    }

    // Sends not started are dropped (control frames stay: a goodbye must still go out); a
    // frame half written keeps a copy of its tail; a payload arriving is read into nothing.
    void detach_buffers(tcp_peer& p) noexcept {
        if (p.in_frame && p.in_type == tcp_wire::frame_data) {
            p.in_op.reset();
            p.in_heap = {};
            p.in_discard = true;
            p.parked = false;  // read on, into nothing (poll_once reads it again)
        }
        std::erase_if(p.out, [](tcp_frame const& f) { return f.op && f.sent == 0; });
        if (p.out.empty() || !p.out.front().op) return;
        tcp_frame& f = p.out.front();
        std::size_t const from = f.sent > tcp_wire::header_size ? f.sent - tcp_wire::header_size : 0;
        if (f.size - from > max_detached_tail) return close_peer(p);  // a copy would cost more than the abort frame is worth
        try {
            f.owned.assign(f.op->out + from, f.op->out + f.size);
            f.skip = from;
            f.op.reset();
        } catch (...) {  // no memory for the tail: the stream cannot be kept whole
            close_peer(p);
        }
    }

    // Queues a frame that owns its payload (an abort reason, whose tag is the rank blamed + 1;
    // empty for a goodbye).
    static void queue_control(tcp_peer& p, std::uint64_t type, std::string const& payload, rank_t blame = -1) noexcept {
        try {
            tcp_frame& f = p.out.emplace_back();
            tcp_wire::encode(f.header.data(), {type, static_cast<tag_t>(blame + 1), payload.size()});
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
        p.stop_writing();
        asio::error_code ec;
        p.sock.close(ec);
    }

    // A write failed. A goodbye or an abort may be waiting, unread, that says why: read first.
    void write_failed(tcp_peer& p, std::string const& why) {
        if (!p.goodbye_in) p.pump_read(*this, max_control_bytes + tcp_wire::header_size + (8 << 20));
        if (!p.finished) connection_error(p, why);
    }

    // The connection ended or broke. After the peer's goodbye (or during our shutdown) that is
    // expected, unless something was still to go to or come from the peer: then it left the
    // group in the middle of it. Otherwise the group failed at that peer.
    void connection_error(tcp_peer& p, std::string const& why) {
        bool const expected = p.goodbye_in || shut_;
        bool pending = p.in_op != nullptr;
        std::string const lost = "rank " + std::to_string(me_) + ": connection to rank " + std::to_string(p.rank);
        p.finished = true;
        p.stop_writing();
        for (auto& f : p.out)
            if (f.op) {
                f.op->fail(errc::peer_failed, lost + " closed before a send completed: " + why);
                pending = true;
            }
        p.out.clear();
        if (p.in_op) std::exchange(p.in_op, nullptr)->fail(errc::peer_failed, lost + " closed during a receive: " + why);
        p.in_frame = false;
        if (!expected)
            defer_failure(p.rank, "connection to rank " + std::to_string(p.rank) + " lost: " + why);
        else if (!shut_ && (pending || queue_of(p.rank).has_receives()))
            defer_failure(p.rank, left_message(me_, p.rank, "still exchanged messages with it"));
    }

    void shutdown() noexcept {
        stop_beating();
        shut_ = true;  // from now on an end of file is expected
        flushing_ = true;
        bool const failed = failure_.failed();
        auto const deadline = clock::now() + (failed ? exit_grace : setup_);
        // The goodbyes (after a failure an abort, unless we told it already: our end of stream
        // must not read as a failure of ours), then the end of our streams.
        for (auto& p : peers_) {
            if (!p || p->finished) continue;
            if (!failed) queue_control(*p, tcp_wire::frame_goodbye, {});
            else if (!told_) queue_control(*p, tcp_wire::frame_abort, failure_.reason(), failure_.blamed());
        }
        settle(deadline, [](tcp_peer const& p) { return p.out.empty(); });
        for (auto& p : peers_) {
            if (!p || p->finished) continue;
            p->stop_writing();
            asio::error_code ec;
            p->sock.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
        }
        // Every byte acknowledged (the end of stream included), the input read meanwhile.
        settle(deadline, [](tcp_peer& p) {
            int unacked = 0;
            return ::ioctl(p.sock.native_handle(), SIOCOUTQ, &unacked) != 0 || unacked == 0;
        });
        for (auto& p : peers_)
            if (p) {
                p->stop_writing();
                asio::error_code ec;
                p->sock.close(ec);
            }
    }

    // Drives the connections until `settled(peer)` holds for every open one, the deadline, or
    // exit_grace after the group failed (a silent peer is found by liveness meanwhile).
    template <class Settled>
    void settle(clock::time_point deadline, Settled const& settled) noexcept {
        try {
            progress(deadline, [&] {
                if (failure_.failed() && clock::now() >= failed_at_ + exit_grace) return true;
                return std::ranges::all_of(peers_, [&](auto const& p) { return !p || p->finished || settled(*p); });
            });
        } catch (...) {
        }
    }

    // ---- liveness --------------------------------------------------------------------------

    bool beating() const noexcept { return heartbeat_.count() > 0; }
    std::chrono::milliseconds silence_limit() const noexcept { return 5 * heartbeat_; }

    // The heartbeat thread: a heartbeat on every connection each heartbeat_, until stopped.
    void beat() noexcept {
        std::unique_lock lock(beat_mutex_);
        while (!beat_cv_.wait_for(lock, heartbeat_, [&] { return beat_stop_; })) {
            lock.unlock();
            for (auto& p : peers_)
                if (p) p->send_heartbeat();
            lock.lock();
        }
    }
    void stop_beating() noexcept {
        if (!beat_thread_.joinable()) return;
        {
            std::lock_guard const lock(beat_mutex_);
            beat_stop_ = true;
        }
        beat_cv_.notify_one();
        beat_thread_.join();
    }

    // Whether a peer's silence may be held against it: it is in the group, and between frames
    // (in the middle of one, its heartbeats cannot reach us).
    static bool can_be_silent(tcp_peer const& p) noexcept {
        return !p.finished && !p.goodbye_in && !p.in_frame && p.end == p.begin;
    }

    // Called while waiting: every half heartbeat, notes which peers were heard from; fails the
    // group at a peer silent for silence_limit(). A gap since the last look longer than a
    // heartbeat means this rank was not listening (it computed): nobody could be heard, and
    // every peer's silence starts anew.
    void check_liveness(clock::time_point now) noexcept {
        if (!beating() || now < next_check_ || failure_.failed()) return;
        bool const away = now - next_check_ > heartbeat_;
        next_check_ = now + heartbeat_ / 2;
        for (auto& p : peers_) {
            if (!p) continue;
            if (p->heard || away || !can_be_silent(*p)) {
                p->heard = false;
                p->heard_at = now;
            }
        }
        try {
            if (auto const s = silent_peer(now, silence_limit())) fail_group(s->first, silence_message(s->first, s->second));
        } catch (...) {  // no memory for the text: the next check tries again
        }
    }

    // The peer silent longest, if longer than `limit`, with how long in ms.
    std::optional<std::pair<rank_t, long long>> silent_peer(clock::time_point now, std::chrono::milliseconds limit) const {
        if (!beating()) return std::nullopt;
        std::optional<std::pair<rank_t, long long>> worst;
        for (auto const& p : peers_) {
            if (!p || p->heard || !can_be_silent(*p)) continue;
            auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - p->heard_at).count();
            if (ms > limit.count() && (!worst || ms > worst->second)) worst.emplace(p->rank, ms);
        }
        return worst;
    }

    std::string silence_message(rank_t peer, long long ms) const {
        return "rank " + std::to_string(me_) + ": rank " + std::to_string(peer) + " sent nothing, not even a heartbeat, for " +
               std::to_string(ms) + " ms (CHORUS_HEARTBEAT_MS = " + std::to_string(heartbeat_.count()) +
               "): it is stopped, stuck, or its host is unreachable";
    }

    // ---- progress --------------------------------------------------------------------------

    // Drives every connection until done() (true), the group failed (true) or the deadline
    // passed (false).
    template <class Done>
    bool progress(clock::time_point deadline, Done const& done) {
        auto const spin_until = clock::now() + spin_;
        for (;;) {
            fail_if_pending();
            if (done()) return true;
            if (failure_.failed() && !flushing_) return true;
            auto const now = clock::now();
            if (now >= deadline) return false;
            check_liveness(now);
            if (now < spin_until) {
                poll_once(0);
                if (companion_) companion_->poke();
                ::sched_yield();  // a rank of this host that is runnable on our core goes first
                ++stats_.yields;
            } else {
                auto wake = deadline;  // the deadline, the next liveness check, the companion's turn
                if (beating() && !failure_.failed()) wake = std::min(wake, std::max(next_check_, now));
                wake = now + companion_sleep(companion_, wake - now);
                poll_once(std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now).count());
                if (companion_) companion_->poke();
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
            // A parked connection is not read (flow control), only watched for its end.
            short const in = p->parked ? POLLRDHUP : POLLIN;
            fds_.push_back({p->sock.native_handle(), static_cast<short>(in | (p->wants_write() ? POLLOUT : 0)), 0});
            ready_.push_back(p.get());
        }
        timespec ts{static_cast<time_t>(timeout_ns / 1000000000), static_cast<long>(timeout_ns % 1000000000)};
        ++stats_.polls;
        int ready = 0;
        if (timeout_ns > 0) {
            ++stats_.sleeps;
            auto const t0 = clock::now();
            ready = ::ppoll(fds_.data(), fds_.size(), &ts, nullptr);
            stats_.slept_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
        } else {
            ready = ::ppoll(fds_.data(), fds_.size(), &ts, nullptr);
        }
        if (ready <= 0) return;  // timeout, or EINTR: the caller loops
        // Reads first: what a peer sent before its connection broke (a goodbye, an abort) says
        // why the write that fails next failed.
        for (std::size_t i = 0; i < fds_.size(); ++i) {
            short const ev = fds_[i].revents;
            if (ready_[i]->parked && (ev & (POLLRDHUP | POLLHUP | POLLERR)))
                connection_error(*ready_[i], "it closed while its message of " + std::to_string(ready_[i]->in_size) +
                                                 " bytes waited for a receive");
            else if (ev & (POLLIN | POLLHUP | POLLERR)) ready_[i]->pump_read(*this);
            if ((ev & (POLLOUT | POLLERR)) && !ready_[i]->finished) ready_[i]->pump_write(*this);
        }
    }

    // A header is in staging: decide where its payload goes.
    void begin_frame(tcp_peer& p) {
        auto const h = tcp_wire::decode_frame(reinterpret_cast<unsigned char const*>(p.staging.data() + p.begin));
        p.begin += tcp_wire::header_size;
        if (h.type == tcp_wire::frame_heartbeat && h.size == 0) return;
        if (h.type == tcp_wire::frame_goodbye && h.size == 0) {
            p.goodbye_in = true;
            if (!failure_.failed() && queue_of(p.rank).has_receives())
                defer_failure(p.rank, left_message(me_, p.rank, "waited for a message from it"));
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
            defer_failure(p.rank, "rank " + std::to_string(me_) + ": rank " + std::to_string(p.rank) + " sent a message of " +
                                      std::to_string(h.size) + " bytes (" + describe_tag(h.tag) +
                                      ") before its receive was posted, more than CHORUS_MAX_MESSAGE_BYTES = " +
                                      std::to_string(max_message_));
            return;
        }
        if (h.type == tcp_wire::frame_data && p.in_size > max_unexpected_ - std::min(unexpected_, max_unexpected_)) {
            // Flow control: no more unexpected data is held. The message waits in the socket
            // (and the sender's send with it) until its receive is posted; what the sender
            // sends after it waits too.
            p.parked = true;
            return;
        }
        try {
            p.in_heap = heap_bytes::make(p.in_size);
            if (h.type == tcp_wire::frame_data) unexpected_ += p.in_size;
            if (h.type == tcp_wire::frame_data) stats_.bytes_unexpected += p.in_size;
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
            // The rank it blames: the sender, unless it names another (not us: a peer that
            // timed out waiting for us blames itself, from where we stand).
            tag_t const named = p.in_tag;  // the blamed rank + 1, whatever a peer wrote there
            bool const other = named >= 1 && named <= static_cast<tag_t>(size()) && named - 1 != static_cast<tag_t>(me_);
            rank_t const blame = other ? static_cast<rank_t>(named - 1) : p.rank;
            heap_bytes const bytes = std::exchange(p.in_heap, {});
            fail_group(blame, printable(std::string_view(reinterpret_cast<char const*>(bytes.span().data()), bytes.size())), false);
        } else {
            arrived(p.rank, p.in_tag, std::exchange(p.in_heap, {}));
        }
    }

    rank_t me_;
    std::chrono::milliseconds timeout_;  // 0: waits are not bounded
    std::chrono::milliseconds setup_;    // bounds the goodbye at shutdown
    std::chrono::milliseconds heartbeat_;
    std::chrono::microseconds spin_;
    std::size_t max_message_;  // the largest message accepted before its receive is posted
    std::size_t max_unexpected_;  // the most bytes held for receives not yet posted
    std::size_t unexpected_ = 0;  // bytes held (or being read) for receives not yet posted
    int blame_fd_;             // CHORUS_BLAME_FD, or -1
    // io_ first: sockets (in peers_) must be destroyed before their io_context.
    std::unique_ptr<asio::io_context> io_;
    std::vector<std::unique_ptr<tcp_peer>> peers_;  // null for self
    std::vector<queue_t> queues_;                   // by sender
    std::vector<pollfd> fds_;      // poll_once's scratch, kept to avoid an allocation per wait
    std::vector<tcp_peer*> ready_;
    group_failure failure_;
    tcp_stats stats_;
    companion* companion_ = nullptr;
    clock::time_point failed_at_{};
    bool told_ = false;  // the peers got an abort frame from us (else shutdown tells them)
    std::optional<std::pair<rank_t, std::string>> pending_;  // a failure found inside a read
    bool flushing_ = false;  // flush() or shutdown() drive the sockets of a failed group
    bool shut_ = false;
    clock::time_point next_check_{};  // liveness: when to look next
    std::thread beat_thread_;         // sends the heartbeats
    std::mutex beat_mutex_;
    std::condition_variable beat_cv_;
    bool beat_stop_ = false;
};

} // namespace chorus::detail
