// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// One TCP connection of the engine (engine.hpp): frames out, bytes in. A send is one gathered
// sendmsg of its header and the user's buffer (no copy), coalescing queued frames; it
// completes when its last byte is in the socket. Reads go through a 64 KiB staging buffer, so
// a small message and the headers after it take one recv; a payload with a posted receive is
// copied from staging, and recv'd straight into the user's buffer once what remains is larger
// than staging; an unexpected one goes to a heap buffer.
//
// The engine's heartbeat thread writes to the connection too (send_heartbeat): every write
// happens under the connection's write lock, and a heartbeat goes only between frames (a
// half-written frame or heartbeat is finished first, by whoever writes next).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include <asio/ip/tcp.hpp>

#include <sys/socket.h>  // sendmsg/recv
#include <sys/uio.h>     // iovec: gathered writes

#include <chorus/detail/matching.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/tcp/config.hpp>
#include <chorus/transport/tcp/wire.hpp>

namespace chorus::detail {

/// One send or receive, shared by its request and, while in flight, its connection.
struct tcp_op : message_op {
    std::byte* in = nullptr;         // receive buffer
    std::byte const* out = nullptr;  // send buffer
};

/// A frame queued for writing. Its payload is the send's buffer, or `owned` for control frames
/// and for a send detached from its buffer, which then holds the payload from byte `skip` on.
struct tcp_frame {
    std::array<unsigned char, tcp_wire::header_size> header{};
    std::shared_ptr<tcp_op> op;
    std::vector<std::byte> owned;
    std::size_t skip = 0;
    std::size_t size = 0;  // payload bytes
    std::size_t sent = 0;  // bytes of header + payload written so far

    std::size_t total() const noexcept { return tcp_wire::header_size + size; }
    std::byte const* payload_at(std::size_t offset) const noexcept {
        return op ? op->out + offset : owned.data() + (offset - skip);
    }
};

/// Bytes on the heap that are not zero-filled: an unexpected message's pages are touched only
/// as its bytes arrive (a vector would write every byte of a large one before the first came).
/// Scratch memory (host_memory::buffer, from the thread's scratch cache), as the algorithms'
/// scratch: the next message of the same size lands in pages already faulted in, not in fresh
/// ones from the kernel.
class heap_bytes {
public:
    heap_bytes() = default;
    static heap_bytes make(std::size_t n) {
        heap_bytes h;
        h.bytes_ = host_memory::buffer<std::byte>(n);
        return h;
    }
    static heap_bytes copy_of(std::span<std::byte const> s) {
        heap_bytes h = make(s.size());
        if (!s.empty()) std::memcpy(h.data(), s.data(), s.size());
        return h;
    }
    std::byte* data() noexcept { return bytes_.span().data(); }
    std::size_t size() const noexcept { return bytes_.size(); }
    std::span<std::byte const> span() const noexcept { return bytes_.span(); }

private:
    host_memory::buffer<std::byte> bytes_;
};

struct tcp_message {
    tag_t tag;
    heap_bytes bytes;
};

/// One connection and the state of its two directions: what is written (frames queued, the
/// first one maybe half sent) and what is read (staged bytes, the frame arriving).
struct tcp_peer {
    tcp_peer(rank_t r, asio::ip::tcp::socket s, tcp_stats& counters)
        : rank(r), sock(std::move(s)), stats(counters), staging(64 * 1024) {
        tcp_wire::encode(heartbeat.data(), {tcp_wire::frame_heartbeat, 0, 0});
    }
    rank_t rank;
    asio::ip::tcp::socket sock;
    tcp_stats& stats;  // the engine's counters (pump_write and pump_read run in its thread)
    // reading: staging[begin, end) holds bytes received but not yet consumed
    std::vector<std::byte> staging;
    std::size_t begin = 0, end = 0;
    bool in_frame = false;  // a header was parsed, its payload is arriving
    std::uint64_t in_type = 0;
    tag_t in_tag = 0;
    std::size_t in_size = 0, in_got = 0;
    std::shared_ptr<tcp_op> in_op;   // the posted receive the payload goes to, or
    heap_bytes in_heap;              // an unexpected message's (or an abort reason's) bytes, or
    bool in_discard = false;         // nowhere (the group failed, or the receive was too small)
    bool parked = false;             // not read until its receive is posted (flow control)
    bool heard = false;  // bytes arrived since the engine's liveness check last looked
    std::chrono::steady_clock::time_point heard_at{};  // when the liveness check last knew it alive
    // writing
    std::deque<tcp_frame> out;
    bool goodbye_in = false;
    bool finished = false;  // EOF after goodbye, or broken: no more reads or writes

    // Shared with the heartbeat thread, under write_lock: whether it may write (the socket is
    // open and whole), whether a frame is half written (nothing may go between its bytes), and
    // how much of a heartbeat is still to write (read unlocked by poll_once, hence atomic).
    std::mutex write_lock;
    bool writable = true;
    bool mid_frame = false;
    std::atomic<std::size_t> heartbeat_left{0};
    std::array<unsigned char, tcp_wire::header_size> heartbeat{};

    bool wants_write() const noexcept { return !out.empty() || heartbeat_left.load(std::memory_order_relaxed) != 0; }

    /// The heartbeat thread's beat: a heartbeat frame, unless a frame is half written (then
    /// bytes flow anyway, or the peer is not reading) or the socket is not ours to write.
    void send_heartbeat() noexcept {
        std::lock_guard const lock(write_lock);
        if (!writable || mid_frame || heartbeat_left.load(std::memory_order_relaxed) != 0) return;
        ssize_t const n = ::send(sock.native_handle(), heartbeat.data(), heartbeat.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0 && static_cast<std::size_t>(n) < heartbeat.size())
            heartbeat_left.store(heartbeat.size() - static_cast<std::size_t>(n), std::memory_order_relaxed);
    }

    /// No more writes on this connection, by anyone.
    void stop_writing() noexcept {
        std::lock_guard const lock(write_lock);
        writable = false;
    }

    // The engine decides what arriving frames mean and what a broken connection does: these
    // call back its begin_frame(peer), end_frame(peer) and connection_error(peer, why).

    // Sends as much of the queue as the socket takes now, several frames per sendmsg (the rest
    // of a half-written heartbeat first).
    template <class Engine>
    void pump_write(Engine& e) {
        constexpr std::size_t max_frames = 16;
        int error = 0;
        {
            std::lock_guard const lock(write_lock);
            while (wants_write() && writable && !finished) {
                std::array<iovec, 2 * max_frames + 1> iov{};
                std::size_t count = 0;
                std::size_t const beat = heartbeat_left.load(std::memory_order_relaxed);
                if (beat) iov[count++] = {heartbeat.data() + heartbeat.size() - beat, beat};
                for (std::size_t i = 0; i < out.size() && i < max_frames; ++i) {
                    tcp_frame& f = out[i];
                    if (f.sent < tcp_wire::header_size) iov[count++] = {f.header.data() + f.sent, tcp_wire::header_size - f.sent};
                    std::size_t const from = f.sent > tcp_wire::header_size ? f.sent - tcp_wire::header_size : 0;
                    if (from < f.size) iov[count++] = {const_cast<std::byte*>(f.payload_at(from)), f.size - from};
                }
                msghdr msg{};
                msg.msg_iov = iov.data();
                msg.msg_iovlen = count;
                std::size_t wanted = 0;
                for (std::size_t i = 0; i < count; ++i) wanted += iov[i].iov_len;
                ++stats.send_calls;
                ssize_t const n = ::sendmsg(sock.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n < 0) {
                    if (errno == EINTR) continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK) error = errno;
                    else ++stats.send_full;
                    break;
                }
                stats.bytes_sent += static_cast<std::size_t>(n);
                if (static_cast<std::size_t>(n) < wanted) ++stats.send_full;
                std::size_t const beat_sent = std::min(beat, static_cast<std::size_t>(n));
                heartbeat_left.store(beat - beat_sent, std::memory_order_relaxed);
                sent(static_cast<std::size_t>(n) - beat_sent);
            }
            mid_frame = !out.empty() && out.front().sent > 0;
        }
        if (error) e.write_failed(*this, std::strerror(error));
    }

    // `n` bytes of the queue's front frames went out: complete the frames they finish.
    void sent(std::size_t n) {
        while (!out.empty()) {
            tcp_frame& f = out.front();
            std::size_t const take = std::min(n, f.total() - f.sent);
            f.sent += take;
            n -= take;
            if (f.sent < f.total()) break;
            if (f.op) f.op->done = true;
            out.pop_front();
        }
    }

    // One recv, non-blocking: bytes received, or 0 when there is nothing now or the
    // connection ended (then handled).
    template <class Engine>
    std::size_t receive(Engine& e, std::byte* into, std::size_t len) {
        for (;;) {
            ++stats.recv_calls;
            ssize_t const n = ::recv(sock.native_handle(), into, len, MSG_DONTWAIT);
            if (n > 0) {
                heard = true;
                stats.bytes_received += static_cast<std::size_t>(n);
                return static_cast<std::size_t>(n);
            }
            if (n == 0) {
                e.connection_error(*this, "End of file");
                return 0;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) e.connection_error(*this, std::strerror(errno));
            else ++stats.recv_empty;
            return 0;
        }
    }

    // Reads what the socket has now, and consumes it. The budget bounds the bytes received per
    // call (so that writes get their turn), never the parsing of bytes already staged: a frame
    // complete in memory must be finished now, as no further readiness may ever announce it.
    //
    // A payload no receive was posted for yet goes to a fresh heap buffer, whose pages fault in
    // as it fills (an expensive exit to the hypervisor on a virtual machine), to be copied again
    // when its receive comes: only 256 KiB of it per call. The waiter this read serves may be
    // done already (a barrier's message, with a large send of the peer right behind it): it
    // returns and posts the receive, and the rest lands in place. A waiter still waiting calls
    // again, so the message is read all the same (the progress rule holds). `held` lifts that
    // bound, for a caller that must see what follows such a payload.
    template <class Engine>
    void pump_read(Engine& e, std::size_t held = 256 << 10) {
        std::size_t budget = 8 << 20;
        while (!finished && !parked) {
            std::size_t got = 0;
            if (!in_frame) {
                if (end - begin >= tcp_wire::header_size) {
                    e.begin_frame(*this);
                    continue;
                }
                if (budget == 0) return;
                got = receive_header_bytes(e);
            } else if (in_got == in_size) {
                e.end_frame(*this);
                continue;
            } else if (consume_staged()) {
                continue;
            } else {
                bool const unexpected = !in_op && !in_discard;
                if (budget == 0 || (unexpected && held == 0)) return;
                got = receive_payload(e, unexpected ? held : budget);
                if (unexpected) held -= std::min(held, got);
            }
            if (got == 0) return;
            budget -= std::min(budget, got);
        }
    }

    template <class Engine>
    std::size_t receive_header_bytes(Engine& e) {
        if (begin > 0) {  // keep a partial header at the front
            std::memmove(staging.data(), staging.data() + begin, end - begin);
            end -= begin;
            begin = 0;
        }
        std::size_t const got = receive(e, staging.data() + end, staging.size() - end);
        end += got;
        return got;
    }

    std::byte* payload_target() noexcept {
        return in_op ? in_op->in : in_discard ? nullptr : in_heap.data();
    }

    // Moves staged bytes into the arriving payload; false when staging is empty.
    bool consume_staged() {
        std::size_t const have = std::min(end - begin, in_size - in_got);
        if (have == 0) return false;
        if (std::byte* into = payload_target()) {
            std::memcpy(into + in_got, staging.data() + begin, have);
            if (in_op) stats.bytes_staged += have;
        }
        begin += have;
        in_got += have;
        return true;
    }

    // Staging is empty: a large remainder goes straight into place (at most `most` bytes of
    // it), a small one via staging.
    template <class Engine>
    std::size_t receive_payload(Engine& e, std::size_t most) {
        begin = end = 0;
        std::byte* const into = payload_target();
        std::size_t const left = in_size - in_got;
        if (into && left >= staging.size()) {
            std::size_t const got = receive(e, into + in_got, std::min(left, std::max(most, staging.size())));
            in_got += got;
            if (in_op) stats.bytes_direct += got;
            return got;
        }
        end = receive(e, staging.data(), staging.size());
        return end;
    }
};

} // namespace chorus::detail
