// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_transport's engine (see <chorus/transport/tcp.hpp>). Included by tcp.hpp unless
// CHORUS_TCP_SEPARATE_COMPILATION is defined; then include it in exactly one .cpp file of the
// program (with the macro defined there too), which compiles the engine once.
//
// Rendezvous. Rank 0 listens on master_addr:master_port (or adopts the listening socket a
// launcher bound for it, master_fd, so the port cannot be taken in between). Every rank, rank 0
// included, first opens its own listening socket (an ephemeral port, or the first free one of
// port_min..port_max), then connects to the master (retrying with back-off: the master may not
// be up yet) and sends {token, rank, size, port, address}, the address being advertise_addr, the
// address of interface socket_ifname, or by default the local end of its master connection
// (the address the master can reach it on). Rank 0 collects all ranks, then sends everyone the
// table of (address, port). Each
// rank then connects to every lower rank and accepts from every higher rank: every pair gets
// exactly one connection, and since listening sockets exist before anyone connects, nobody can
// wait for a connection that is not yet being accepted (no deadlock). A connection whose
// handshake is wrong (token, rank, garbage) is closed and logged on stderr: a port scanner or
// another job's stray rank must not break this job. The rendezvous is async on an Asio
// io_context, run by the constructor's thread until a deadline, so one timeout bounds it all.
//
// Frames. Every message is a 24-byte header {type, tag, size} (little endian u64s) followed
// by `size` payload bytes. One connection per pair, one frame at a time per direction, give
// FIFO order per (sender, tag). Control frames: abort (payload = reason) fails the receiver's
// group naming the sender; goodbye says "I am shutting down", so the EOF that follows is not a
// failure.
//
// Progress, in the caller's thread. After the rendezvous the sockets are non-blocking and no
// thread of ours runs: isend writes what the socket takes at once, and every wait() or test()
// drives all connections (ppoll, then sendmsg/recv) until its request completed. A handoff to
// an io thread costs two context switches per message, several times the loopback round trip
// of a small message; driving the sockets where the data is wanted costs none, and
// is what MPI implementations do. A send is one gathered sendmsg of its header and the user's
// buffer (no copy), coalescing queued frames; it completes when its last byte is in the
// socket. Reads go through a 64 KiB staging buffer per connection, so a small message and the
// headers after it take one recv; a payload for which a matching receive is posted (same
// sender, tag and size) is copied from staging, and recv'd straight into the user's buffer
// once what remains is larger than staging. An unexpected message goes to a heap buffer and
// is matched like loopback's eager messages (unexpected queue, size/tag checks); when its
// receive is posted while it is still arriving, the rest goes straight to the user's buffer.
// Because every wait drains every socket, a send completes whatever order the ranks post in:
// the progress rule holds for messages larger than the socket buffers (but, as in MPI, only
// while the receiving rank is inside some call of its transport).
//
// Waiting. A waiter spins on ppoll(0) + sched_yield for up to tcp_config::spin, then
// blocks in ppoll until its deadline: a blocked waiter on an idle host wakes up tens of
// microseconds late, and the yield hands the core to a rank that has work when there are more
// ranks than cores.
//
// Ownership. A buffer is touched only inside calls of the transport, and never after its
// request is gone: a request that gives up (timeout, failure, destruction) fails the group,
// which detaches every operation from its buffer (the unsent tail of a frame half written is
// copied, so the stream stays well-formed for the abort frame behind it; a payload half read
// is read on into nothing). One thread drives a transport at a time.

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

// Only the parts of Asio used here, not <asio.hpp>: it is most of a user's compile time.
#include <asio/buffer.hpp>
#include <asio/connect.hpp>
#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <ifaddrs.h>     // getifaddrs: CHORUS_SOCKET_IFNAME
#include <poll.h>        // ppoll: waiting on every connection at once
#include <sched.h>       // sched_yield: spinning politely
#include <sys/uio.h>     // iovec: gathered writes
#include <sys/socket.h>  // sendmsg/recv; getsockname/getsockopt: a launcher's master socket
#include <unistd.h>      // close

#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>

#include <chorus/transport/tcp.hpp>

namespace chorus {

namespace detail {

namespace tcp_wire {
inline constexpr std::uint64_t hello_magic = 0x31305355524f4843ULL;  // "CHORUS01"
inline constexpr std::uint64_t mesh_magic = 0x31304853454d4843ULL;   // "CHMESH01"
inline constexpr std::uint64_t frame_data = 1, frame_abort = 2, frame_goodbye = 3;
inline constexpr std::size_t header_size = 24;
inline constexpr std::size_t max_token = 4096, max_addr = 256;

inline void put64(unsigned char* p, std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get64(unsigned char const* p) noexcept {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
    return v;
}
inline void append64(std::vector<unsigned char>& out, std::uint64_t v) {
    unsigned char b[8];
    put64(b, v);
    out.insert(out.end(), b, b + 8);
}
inline void append(std::vector<unsigned char>& out, std::string const& s) {
    out.insert(out.end(), s.begin(), s.end());
}
} // namespace tcp_wire

/// One send or receive, shared by its request and, while in flight, its connection.
struct tcp_op {
    bool is_send = false;
    rank_t peer = 0;
    tag_t tag = 0;
    std::span<std::byte> in;          // receive buffer
    std::span<std::byte const> out;   // send buffer
    bool done = false;
    bool posted = false;  // in the posted-receive list
    errc error{};
    std::string message;
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
        return op ? op->out.data() + offset : owned.data() + (offset - skip);
    }
};

struct tcp_unexpected {
    tag_t tag;
    std::vector<std::byte> bytes;
};

struct tcp_peer {
    explicit tcp_peer(asio::io_context& io) : sock(io) {}
    rank_t rank = -1;
    asio::ip::tcp::socket sock;
    // reading: staging[begin, end) holds bytes received but not yet consumed
    std::vector<std::byte> staging;
    std::size_t begin = 0, end = 0;
    bool in_frame = false;  // a header was parsed, its payload is arriving
    std::uint64_t in_type = 0;
    tag_t in_tag = 0;
    std::size_t in_size = 0, in_got = 0;
    std::shared_ptr<tcp_op> in_op;  // the posted receive the payload goes to, or
    std::vector<std::byte> in_heap; // an unexpected message's (or an abort reason's) bytes, or
    bool in_discard = false;        // nowhere (the group failed)
    // writing
    std::deque<tcp_frame> out;
    bool goodbye_in = false;
    bool finished = false;  // EOF after goodbye, or broken: no more reads or writes
};

/// "[::1]" -> "::1": URLs and launchers write IPv6 literals in brackets, Asio does not.
inline std::string strip_brackets(std::string addr) {
    if (addr.size() >= 2 && addr.front() == '[' && addr.back() == ']') return addr.substr(1, addr.size() - 2);
    return addr;
}

/// The address of interface `name` in the given family (IPv6: a global or unique-local one
/// before a link-local one, which would need a scope to be reachable). Empty if none.
inline std::string interface_address(std::string const& name, bool v6) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return {};
    std::string found, link_local;
    for (ifaddrs* i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || name != i->ifa_name) continue;
        if (!v6 && i->ifa_addr->sa_family == AF_INET) {
            asio::ip::address_v4::bytes_type b;
            std::memcpy(b.data(), &reinterpret_cast<sockaddr_in const*>(i->ifa_addr)->sin_addr, 4);
            found = asio::ip::address_v4(b).to_string();
            break;
        }
        if (v6 && i->ifa_addr->sa_family == AF_INET6) {
            asio::ip::address_v6::bytes_type b;
            std::memcpy(b.data(), &reinterpret_cast<sockaddr_in6 const*>(i->ifa_addr)->sin6_addr, 16);
            asio::ip::address_v6 const a(b);
            if (a.is_link_local()) {
                if (link_local.empty()) link_local = a.to_string() + "%" + name;
                continue;
            }
            found = a.to_string();
            break;
        }
    }
    ::freeifaddrs(list);
    return found.empty() ? link_local : found;
}

inline void tune_socket(asio::ip::tcp::socket& s) {
    asio::error_code ec;
    s.set_option(asio::ip::tcp::no_delay(true), ec);
    s.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
    s.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
}

class tcp_state {
public:
    explicit tcp_state(tcp_config cfg) : cfg_(std::move(cfg)) {
        if (cfg_.size < 1) throw invalid_argument("tcp_transport: size must be at least 1, got " + std::to_string(cfg_.size));
        if (cfg_.rank < 0 || cfg_.rank >= cfg_.size)
            throw invalid_argument("tcp_transport: rank " + std::to_string(cfg_.rank) + " is out of range for " +
                                   std::to_string(cfg_.size) + " ranks");
        if (cfg_.job_token.size() > tcp_wire::max_token) throw invalid_argument("tcp_transport: job token too long");
        if (cfg_.port_min > cfg_.port_max)
            throw invalid_argument("tcp_transport: port range " + std::to_string(cfg_.port_min) + "-" +
                                   std::to_string(cfg_.port_max) + " is empty");
        if (cfg_.size == 1 && cfg_.master_fd >= 0) ::close(std::exchange(cfg_.master_fd, -1));
        cfg_.master_addr = strip_brackets(cfg_.master_addr);
        cfg_.advertise_addr = strip_brackets(cfg_.advertise_addr);
        if (cfg_.rank != 0 && cfg_.master_fd >= 0) {  // only rank 0 runs the rendezvous
            ::close(cfg_.master_fd);
            cfg_.master_fd = -1;
        }
        auto const n = static_cast<std::size_t>(cfg_.size);
        posted_.resize(n);
        unexpected_.resize(n);
        peers_.resize(n);
        if (cfg_.size > 1) rendezvous();
        for (auto& p : peers_) {
            if (!p) continue;
            asio::error_code ec;
            p->sock.non_blocking(true, ec);
            if (ec) throw transport_error(errc::connection_failed, p->rank, "rank " + std::to_string(cfg_.rank) + ": " + ec.message());
            p->staging.resize(staging_bytes);
        }
    }

    tcp_state(tcp_state const&) = delete;
    tcp_state& operator=(tcp_state const&) = delete;

    ~tcp_state() { shutdown(); }

    rank_t rank() const noexcept { return cfg_.rank; }
    rank_t size() const noexcept { return cfg_.size; }
    rank_t local_rank() const noexcept { return cfg_.local_rank; }
    std::chrono::milliseconds timeout() const noexcept { return cfg_.timeout; }
    std::uint64_t next_sequence() noexcept { return sequence_++; }

    /// Null when the send completed at once (to self, or written whole into the socket).
    std::shared_ptr<tcp_op> isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        check_peer(peer);
        throw_if_failed();
        if (peer == cfg_.rank) {  // to self: no socket, eager copy
            deliver_or_queue(peer, tag, std::vector<std::byte>(bytes.begin(), bytes.end()));
            return nullptr;
        }
        auto op = std::make_shared<tcp_op>();
        op->is_send = true;
        op->peer = peer;
        op->tag = tag;
        op->out = bytes;
        tcp_peer& p = *peers_[static_cast<std::size_t>(peer)];
        if (p.finished) {
            fail(*op, errc::peer_failed, "rank " + std::to_string(cfg_.rank) + ": cannot send to rank " +
                                             std::to_string(peer) + ", whose connection is closed");
            return op;
        }
        tcp_frame& f = p.out.emplace_back();
        tcp_wire::put64(f.header.data(), tcp_wire::frame_data);
        tcp_wire::put64(f.header.data() + 8, tag);
        tcp_wire::put64(f.header.data() + 16, bytes.size());
        f.size = bytes.size();
        f.op = op;
        if (p.out.size() == 1) pump_write(p);  // the message leaves now, not at the next wait
        if (op->done && op->error == errc{}) return nullptr;
        return op;
    }

    std::shared_ptr<tcp_op> irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        check_peer(peer);
        auto op = std::make_shared<tcp_op>();
        op->peer = peer;
        op->tag = tag;
        op->in = bytes;
        throw_if_failed();
        auto& queue = unexpected_[static_cast<std::size_t>(peer)];
        for (auto it = queue.begin(); it != queue.end(); ++it) {
            if (it->tag == tag) {
                deliver(*op, it->bytes);
                queue.erase(it);
                return op;
            }
            if (tags_conflict(tag, it->tag)) {
                fail(*op, errc::tag_mismatch, collective_mismatch_message(cfg_.rank, tag, peer, it->tag));
                return op;
            }
        }
        // The message may be arriving right now into a heap buffer: take it over, so the rest
        // of it lands in the user's buffer.
        if (peer != cfg_.rank) {
            tcp_peer& p = *peers_[static_cast<std::size_t>(peer)];
            bool const earlier = std::ranges::any_of(posted_[static_cast<std::size_t>(peer)], [&](auto const& r) {
                return r->tag == tag || tags_conflict(r->tag, tag);
            });
            if (p.in_frame && !p.in_op && !p.in_discard && p.in_type == tcp_wire::frame_data && p.in_tag == tag &&
                p.in_size == bytes.size() && !earlier) {
                if (p.in_got) std::memcpy(bytes.data(), p.in_heap.data(), p.in_got);
                p.in_heap = {};
                p.in_op = op;
                return op;
            }
        }
        op->posted = true;
        posted_[static_cast<std::size_t>(peer)].push_back(op);
        return op;
    }

    void wait(std::shared_ptr<tcp_op> const& op) {
        auto const deadline = clock::now() + cfg_.timeout;
        bool const finished = progress(deadline, [&] { return op->done; });
        if (op->done) {
            if (op->error == errc{}) return;
            std::string const what = op->message;
            errc const e = op->error;
            abort(what);
            throw transport_error(e, op->peer, what);
        }
        unpost(*op);
        if (finished) throw_if_failed();  // the group failed while we waited
        std::string const what = wait_timeout_message(cfg_.rank, cfg_.timeout.count(), op->peer, op->is_send, op->tag);
        fail_group(cfg_.rank, what);
        throw timeout_error(op->peer, what);
    }

    bool test(std::shared_ptr<tcp_op> const& op) {
        if (!op->done && !failed_) poll_once(0);
        if (!op->done && !failed_) return false;
        wait(op);  // done or failed: returns or throws at once
        return true;
    }

    /// A request destroyed before it completed.
    void cancel(std::shared_ptr<tcp_op> const& op) noexcept {
        if (op->done) return;
        unpost(*op);
        fail_group(cfg_.rank, abandoned_message(cfg_.rank, op->is_send, op->tag, op->peer));
    }

    void abort(std::string const& reason) noexcept { fail_group(cfg_.rank, reason); }

private:
    using clock = std::chrono::steady_clock;
    static constexpr std::size_t staging_bytes = 64 * 1024;
    static constexpr std::size_t max_control_bytes = 1 << 20;  // an abort reason

    // ---- matching --------------------------------------------------------------------------

    void check_peer(rank_t peer) const {
        if (peer < 0 || peer >= cfg_.size)
            throw invalid_argument(peer_range_message(cfg_.rank, peer, cfg_.size));
    }

    static void fail(tcp_op& op, errc e, std::string message) {
        op.error = e;
        op.message = std::move(message);
        op.done = true;
    }

    void deliver(tcp_op& op, std::span<std::byte const> bytes) {
        if (bytes.size() != op.in.size()) {
            fail(op, errc::size_mismatch, size_mismatch_message(cfg_.rank, bytes.size(), op.peer, op.tag, op.in.size()));
            return;
        }
        if (!bytes.empty()) std::memcpy(op.in.data(), bytes.data(), bytes.size());
        op.done = true;
    }

    // A whole message from src: into the first matching posted receive, else queued.
    void deliver_or_queue(rank_t src, tag_t tag, std::vector<std::byte> bytes) {
        auto& list = posted_[static_cast<std::size_t>(src)];
        for (auto it = list.begin(); it != list.end(); ++it) {
            tcp_op& r = **it;
            if (r.tag == tag) {
                deliver(r, bytes);  // a size mismatch discards the message, as in loopback
                r.posted = false;
                list.erase(it);
                return;
            }
            if (tags_conflict(r.tag, tag)) {
                fail(r, errc::tag_mismatch, collective_mismatch_message(cfg_.rank, r.tag, src, tag));
                r.posted = false;
                list.erase(it);
                break;  // keep the message
            }
        }
        unexpected_[static_cast<std::size_t>(src)].push_back({tag, std::move(bytes)});
    }

    void unpost(tcp_op& op) {
        if (!op.posted) return;
        posted_[static_cast<std::size_t>(op.peer)].remove_if([&](auto const& p) { return p.get() == &op; });
        op.posted = false;
    }

    void throw_if_failed() const {
        if (!failed_) return;
        if (failed_rank_ == cfg_.rank)
            throw transport_error(errc::aborted, cfg_.rank,
                                  "rank " + std::to_string(cfg_.rank) + " aborted earlier: " + failure_);
        throw transport_error(errc::peer_failed, failed_rank_,
                              "rank " + std::to_string(cfg_.rank) + ": the group failed at rank " +
                                  std::to_string(failed_rank_) + ": " + failure_);
    }

    // Marks the group failed on behalf of `who` (first reason kept) and detaches every
    // operation from its buffer. When this rank is the one failing, every peer gets an abort
    // frame, flushed before returning (the caller is about to throw, and maybe to exit).
    void fail_group(rank_t who, std::string const& reason) noexcept {
        if (failed_) return;
        failed_ = true;
        failed_rank_ = who;
        try {
            failure_ = reason;
        } catch (...) {
        }
        for (auto& list : posted_) {
            for (auto& op : list) op->posted = false;
            list.clear();
        }
        for (auto& ptr : peers_) {
            if (!ptr) continue;
            tcp_peer& p = *ptr;
            if (p.in_frame && p.in_type == tcp_wire::frame_data) {  // read on into nothing
                p.in_op.reset();
                p.in_heap = {};
                p.in_discard = true;
            }
            // Sends not started are dropped (control frames stay: a goodbye must still go out);
            // a frame half written keeps a copy of its tail.
            std::erase_if(p.out, [](tcp_frame const& f) { return f.op && f.sent == 0; });
            if (!p.out.empty() && p.out.front().op) {
                tcp_frame& f = p.out.front();
                std::size_t const from = f.sent > tcp_wire::header_size ? f.sent - tcp_wire::header_size : 0;
                try {
                    f.owned.assign(f.op->out.begin() + static_cast<std::ptrdiff_t>(from), f.op->out.end());
                    f.skip = from;
                    f.op.reset();
                } catch (...) {  // no memory for the tail: the stream cannot be kept whole
                    close_peer(p);
                }
            }
            if (who == cfg_.rank && !p.finished) {
                try {
                    tcp_frame& f = p.out.emplace_back();
                    tcp_wire::put64(f.header.data(), tcp_wire::frame_abort);
                    tcp_wire::put64(f.header.data() + 16, reason.size());
                    f.owned.assign(reinterpret_cast<std::byte const*>(reason.data()),
                                   reinterpret_cast<std::byte const*>(reason.data()) + reason.size());
                    f.size = reason.size();
                } catch (...) {  // peers will see the connection close instead
                }
            }
        }
        if (who == cfg_.rank && !flushing_) flush(clock::now() + std::min(cfg_.timeout, std::chrono::milliseconds(2000)));
    }

    // Writes what is queued, reading (and, the group having failed, discarding) meanwhile so
    // that a peer writing to us can progress to reading our frames.
    void flush(clock::time_point deadline) noexcept {
        flushing_ = true;
        try {
            progress(deadline, [&] {
                for (auto& p : peers_)
                    if (p && !p->finished && !p->out.empty()) return false;
                return true;
            });
        } catch (...) {
        }
        flushing_ = false;
    }

    // ---- progress --------------------------------------------------------------------------

    // Drives every connection until done() (true), the group failed (true) or the deadline
    // passed (false).
    template <class Done>
    bool progress(clock::time_point deadline, Done const& done) {
        auto const spin_until = clock::now() + cfg_.spin;
        for (;;) {
            if (done()) return true;
            if (failed_ && !flushing_) return true;
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
        int const n = ::ppoll(fds_.data(), fds_.size(), &ts, nullptr);
        if (n <= 0) return;  // timeout, or EINTR: the caller loops
        for (std::size_t i = 0; i < fds_.size(); ++i) {
            short const ev = fds_[i].revents;
            if (ev == 0) continue;
            tcp_peer& p = *ready_[i];
            if (ev & (POLLOUT | POLLERR)) pump_write(p);
            if (ev & (POLLIN | POLLHUP | POLLERR)) pump_read(p);
        }
    }

    // Sends as much of the queue as the socket takes now, several frames per sendmsg.
    void pump_write(tcp_peer& p) {
        constexpr std::size_t max_frames = 16;
        while (!p.out.empty() && !p.finished) {
            std::array<iovec, 2 * max_frames> iov{};
            std::size_t count = 0;
            for (std::size_t i = 0; i < p.out.size() && i < max_frames; ++i) {
                tcp_frame& f = p.out[i];
                if (f.sent < tcp_wire::header_size)
                    iov[count++] = {f.header.data() + f.sent, tcp_wire::header_size - f.sent};
                std::size_t const from = f.sent > tcp_wire::header_size ? f.sent - tcp_wire::header_size : 0;
                if (from < f.size) iov[count++] = {const_cast<std::byte*>(f.payload_at(from)), f.size - from};
            }
            msghdr msg{};
            msg.msg_iov = iov.data();
            msg.msg_iovlen = count;
            ssize_t const n = ::sendmsg(p.sock.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) connection_error(p, std::strerror(errno));
                return;
            }
            auto left = static_cast<std::size_t>(n);
            while (!p.out.empty()) {
                tcp_frame& f = p.out.front();
                std::size_t const take = std::min(left, f.total() - f.sent);
                f.sent += take;
                left -= take;
                if (f.sent < f.total()) break;
                if (f.op) f.op->done = true;
                p.out.pop_front();
            }
        }
    }

    // One recv, non-blocking: bytes received, or 0 when there is nothing now or the
    // connection ended (then handled).
    std::size_t receive(tcp_peer& p, std::byte* into, std::size_t len) {
        for (;;) {
            ssize_t const n = ::recv(p.sock.native_handle(), into, len, MSG_DONTWAIT);
            if (n > 0) return static_cast<std::size_t>(n);
            if (n == 0) {
                connection_error(p, "End of file");
                return 0;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) connection_error(p, std::strerror(errno));
            return 0;
        }
    }

    // Reads what the socket has now, and consumes it. The budget bounds the bytes received per
    // call (so that writes get their turn), never the parsing of bytes already staged: a frame
    // complete in memory must be finished now, as no further readiness may ever announce it.
    void pump_read(tcp_peer& p) {
        std::size_t budget = 8 << 20;
        for (;;) {
            if (p.finished) return;
            if (!p.in_frame) {
                if (p.end - p.begin >= tcp_wire::header_size) {
                    begin_frame(p);
                    continue;
                }
                if (budget == 0) return;
                if (p.begin > 0) {  // keep a partial header at the front
                    std::memmove(p.staging.data(), p.staging.data() + p.begin, p.end - p.begin);
                    p.end -= p.begin;
                    p.begin = 0;
                }
                std::size_t const got = receive(p, p.staging.data() + p.end, p.staging.size() - p.end);
                if (got == 0) return;
                p.end += got;
                budget -= std::min(budget, got);
                continue;
            }
            std::size_t const left = p.in_size - p.in_got;
            if (left == 0) {
                end_frame(p);
                continue;
            }
            std::byte* const into = p.in_op ? p.in_op->in.data() : p.in_discard ? nullptr : p.in_heap.data();
            if (std::size_t const have = std::min(p.end - p.begin, left)) {
                if (into) std::memcpy(into + p.in_got, p.staging.data() + p.begin, have);
                p.begin += have;
                p.in_got += have;
                continue;
            }
            if (budget == 0) return;
            p.begin = p.end = 0;
            bool const direct = into && left >= p.staging.size();  // large: straight into place
            std::size_t const got = direct ? receive(p, into + p.in_got, left) : receive(p, p.staging.data(), p.staging.size());
            if (got == 0) return;
            (direct ? p.in_got : p.end) += got;
            budget -= std::min(budget, got);
        }
    }

    // A header is in staging: decide where its payload goes.
    void begin_frame(tcp_peer& p) {
        unsigned char const* h = reinterpret_cast<unsigned char const*>(p.staging.data() + p.begin);
        std::uint64_t const type = tcp_wire::get64(h);
        tag_t const tag = tcp_wire::get64(h + 8);
        std::uint64_t const size = tcp_wire::get64(h + 16);
        p.begin += tcp_wire::header_size;
        if (type == tcp_wire::frame_goodbye && size == 0) {
            p.goodbye_in = true;
            return;
        }
        if ((type != tcp_wire::frame_data && type != tcp_wire::frame_abort) ||
            (type == tcp_wire::frame_abort && size > max_control_bytes))
            return connection_error(p, "malformed frame");
        p.in_frame = true;
        p.in_type = type;
        p.in_tag = tag;
        p.in_size = static_cast<std::size_t>(size);
        p.in_got = 0;
        p.in_discard = false;
        if (type == tcp_wire::frame_data) {
            if (failed_) {
                p.in_discard = true;
                return;
            }
            // A posted receive that takes this message as it is gets it directly.
            auto& list = posted_[static_cast<std::size_t>(p.rank)];
            for (auto it = list.begin(); it != list.end(); ++it) {
                tcp_op& r = **it;
                if (r.tag != tag && !tags_conflict(r.tag, tag)) continue;
                if (r.tag == tag && r.in.size() == size) {
                    p.in_op = *it;
                    r.posted = false;
                    list.erase(it);
                    return;
                }
                break;  // a mismatch: handled on the whole message, as loopback does
            }
        }
        try {
            p.in_heap.resize(p.in_size);
        } catch (...) {
            p.in_frame = false;
            connection_error(p, "out of memory for a message of " + std::to_string(size) + " bytes");
        }
    }

    void end_frame(tcp_peer& p) {
        p.in_frame = false;
        if (p.in_op) {
            std::exchange(p.in_op, nullptr)->done = true;
        } else if (p.in_discard) {
            p.in_discard = false;
        } else if (p.in_type == tcp_wire::frame_abort) {
            std::vector<std::byte> const bytes = std::exchange(p.in_heap, {});
            fail_group(p.rank, std::string(reinterpret_cast<char const*>(bytes.data()), bytes.size()));
        } else {
            deliver_or_queue(p.rank, p.in_tag, std::exchange(p.in_heap, {}));
        }
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
        p.finished = true;
        for (auto& f : p.out)
            if (f.op)
                fail(*f.op, errc::peer_failed, "rank " + std::to_string(cfg_.rank) + ": connection to rank " +
                                                   std::to_string(p.rank) + " closed before a send completed: " + why);
        p.out.clear();
        if (p.in_op) {
            fail(*p.in_op, errc::peer_failed, "rank " + std::to_string(cfg_.rank) + ": connection to rank " +
                                                  std::to_string(p.rank) + " closed during a receive: " + why);
            p.in_op.reset();
        }
        p.in_frame = false;
        if (expected) return;
        fail_group(p.rank, "connection to rank " + std::to_string(p.rank) + " lost: " + why);
    }

    // ---- shutdown ----------------------------------------------------------------------

    void shutdown() noexcept {
        bool any = false;
        for (auto& p : peers_) {
            if (!p || p->finished) continue;
            any = true;
            try {
                tcp_frame& f = p->out.emplace_back();
                tcp_wire::put64(f.header.data(), tcp_wire::frame_goodbye);
            } catch (...) {
            }
        }
        if (any) {
            // Our goodbye must go out, and the peer's must arrive: closing a socket with unread
            // data resets the connection, which could destroy what we sent last (an abort frame).
            flushing_ = true;
            try {
                progress(clock::now() + cfg_.timeout, [&] {
                    for (auto& p : peers_)
                        if (p && !p->finished && (!p->out.empty() || !p->goodbye_in)) return false;
                    return true;
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

    // ---- rendezvous (the constructor, async on io_) --------------------------------------

    struct joiner {
        explicit joiner(asio::io_context& io) : sock(io) {}
        asio::ip::tcp::socket sock;
        std::array<unsigned char, 48> head{};
        std::vector<unsigned char> rest;
        std::uint64_t rank = 0, port = 0, token_len = 0;
        std::string addr;
    };
    struct mesh_in {
        explicit mesh_in(asio::io_context& io) : sock(io) {}
        asio::ip::tcp::socket sock;
        std::array<unsigned char, 24> head{};
        std::vector<unsigned char> token;
        std::uint64_t rank = 0;
    };

    void rendezvous() {
        using asio::ip::tcp;
        rank_t const me = cfg_.rank, p = cfg_.size;
        auto const n = static_cast<std::size_t>(p);
        auto const deadline = std::chrono::steady_clock::now() + cfg_.timeout;
        std::string where = cfg_.master_addr + ":" + std::to_string(cfg_.master_port);

        asio::error_code ec;
        asio::ip::address master_ip = asio::ip::make_address(cfg_.master_addr, ec);
        if (ec) {
            tcp::resolver resolver(io_);
            auto results = resolver.resolve(cfg_.master_addr, std::to_string(cfg_.master_port), ec);
            if (ec || results.empty())
                throw transport_error(errc::connection_failed, 0,
                                      "rank " + std::to_string(me) + ": cannot resolve master address " + cfg_.master_addr +
                                          ": " + ec.message());
            master_ip = results.begin()->endpoint().address();
        }
        tcp const family = master_ip.is_v6() ? tcp::v6() : tcp::v4();

        bool finished = false;
        std::string fatal;
        // A connection that is not a rank of this job (a port scanner, another job's rank, a
        // wrong token) is closed and logged; the job goes on.
        auto const refuse = [me](asio::ip::tcp::socket& sock, std::string const& why) {
            asio::error_code e;
            auto const from = sock.remote_endpoint(e);
            std::string const who = e ? std::string("an unknown peer") : from.address().to_string() + " port " + std::to_string(from.port());
            std::fprintf(stderr, "chorus: rank %d: refused a connection from %s: %s\n", me, who.c_str(), why.c_str());
            sock.close(e);
        };
        std::list<asio::steady_timer> timers;

        std::string advertised = cfg_.advertise_addr;
        if (advertised.empty() && !cfg_.socket_ifname.empty()) {
            advertised = interface_address(cfg_.socket_ifname, family == tcp::v6());
            if (advertised.empty())
                throw transport_error(errc::connection_failed, me,
                                      "rank " + std::to_string(me) + ": interface '" + cfg_.socket_ifname + "' (CHORUS_SOCKET_IFNAME) has no " +
                                          (family == tcp::v6() ? "IPv6" : "IPv4") + " address");
        }

        // Own listener, accepting handshakes from higher ranks from the start.
        tcp::acceptor listener(io_);
        bind_listener(listener, family);
        std::uint16_t const my_port = listener.local_endpoint().port();
        std::size_t accepted = 0;
        std::list<std::shared_ptr<mesh_in>> mesh_pending;
        std::function<void()> accept_mesh = [&] {
            auto m = std::make_shared<mesh_in>(io_);
            mesh_pending.push_back(m);
            listener.async_accept(m->sock, [&, m](asio::error_code e) {
                if (finished || e) return;
                accept_mesh();
                asio::async_read(m->sock, asio::buffer(m->head), [&, m](asio::error_code e2, std::size_t got) {
                    if (finished) return;
                    std::uint64_t const len = tcp_wire::get64(m->head.data() + 16);
                    m->rank = tcp_wire::get64(m->head.data() + 8);
                    if (e2) return refuse(m->sock, got ? "not a chorus handshake (" + std::to_string(got) + " bytes, then closed)" : "closed before its handshake");
                    if (tcp_wire::get64(m->head.data()) != tcp_wire::mesh_magic) return refuse(m->sock, "not a chorus handshake");
                    if (len != cfg_.job_token.size()) return refuse(m->sock, "wrong job token");
                    if (m->rank <= static_cast<std::uint64_t>(me) || m->rank >= n || peers_[m->rank])
                        return refuse(m->sock, "unexpected rank " + std::to_string(m->rank));
                    m->token.resize(len);
                    asio::async_read(m->sock, asio::buffer(m->token), [&, m](asio::error_code e3, std::size_t) {
                        if (finished) return;
                        if (e3) return refuse(m->sock, "closed during its handshake");
                        if (std::string(m->token.begin(), m->token.end()) != cfg_.job_token)
                            return refuse(m->sock, "wrong job token");
                        if (peers_[m->rank]) return refuse(m->sock, "rank " + std::to_string(m->rank) + " is already connected");
                        auto peer = std::make_unique<tcp_peer>(io_);
                        peer->rank = static_cast<rank_t>(m->rank);
                        peer->sock = std::move(m->sock);
                        tune_socket(peer->sock);
                        peers_[m->rank] = std::move(peer);
                        ++accepted;
                    });
                });
            });
        };
        accept_mesh();

        // Rank 0: the master, collecting every rank's hello.
        std::optional<tcp::acceptor> master;
        std::vector<std::shared_ptr<joiner>> joined(n);
        std::size_t joined_count = 0, tables_sent = 0;
        std::vector<unsigned char> table;
        std::list<std::shared_ptr<joiner>> master_pending;
        std::function<void()> accept_hello;
        auto send_tables = [&] {
            table.clear();
            std::vector<unsigned char> blob;
            for (auto const& j : joined) {
                tcp_wire::append64(blob, j->port);
                tcp_wire::append64(blob, j->addr.size());
                tcp_wire::append(blob, j->addr);
            }
            tcp_wire::append64(table, blob.size());
            table.insert(table.end(), blob.begin(), blob.end());
            for (auto const& j : joined)
                asio::async_write(j->sock, asio::buffer(table), [&](asio::error_code e, std::size_t) {
                    if (finished) return;
                    if (e) fatal = "rank 0: could not send the rendezvous table: " + e.message();
                    ++tables_sent;
                });
        };
        if (me == 0) {
            master.emplace(io_);
            if (cfg_.master_fd >= 0) {
                adopt_master(*master);
            } else {
                tcp::endpoint const ep(master_ip, cfg_.master_port);
                master->open(ep.protocol(), ec);
                if (!ec) master->set_option(tcp::acceptor::reuse_address(true), ec);
                if (!ec) master->bind(ep, ec);
                if (!ec) master->listen(asio::socket_base::max_listen_connections, ec);
                if (ec)
                    throw transport_error(errc::connection_failed, 0, "rank 0: cannot listen on " + where + ": " + ec.message());
            }
            cfg_.master_port = master->local_endpoint().port();  // the system's pick for port 0
            where = cfg_.master_addr + ":" + std::to_string(cfg_.master_port);
            if (cfg_.on_master_listening) cfg_.on_master_listening(cfg_.master_port);
            accept_hello = [&] {
                auto j = std::make_shared<joiner>(io_);
                master_pending.push_back(j);
                master->async_accept(j->sock, [&, j](asio::error_code e) {
                    if (finished || e) return;
                    accept_hello();
                    asio::async_read(j->sock, asio::buffer(j->head), [&, j](asio::error_code e2, std::size_t got) {
                        if (finished) return;
                        unsigned char const* h = j->head.data();
                        j->rank = tcp_wire::get64(h + 8);
                        j->port = tcp_wire::get64(h + 24);
                        j->token_len = tcp_wire::get64(h + 32);
                        std::uint64_t const addr_len = tcp_wire::get64(h + 40);
                        if (e2) return refuse(j->sock, got ? "not a chorus handshake (" + std::to_string(got) + " bytes, then closed)" : "closed before its handshake");
                        if (tcp_wire::get64(h) != tcp_wire::hello_magic) return refuse(j->sock, "not a chorus handshake");
                        if (j->token_len != cfg_.job_token.size()) return refuse(j->sock, "wrong job token");
                        if (tcp_wire::get64(h + 16) != n)
                            return refuse(j->sock, "it belongs to a job of " + std::to_string(tcp_wire::get64(h + 16)) +
                                                       " ranks, this one has " + std::to_string(n));
                        if (j->rank >= n || addr_len > tcp_wire::max_addr || j->port == 0 || j->port > 65535)
                            return refuse(j->sock, "malformed handshake");
                        j->rest.resize(static_cast<std::size_t>(j->token_len + addr_len));
                        asio::async_read(j->sock, asio::buffer(j->rest), [&, j](asio::error_code e3, std::size_t) {
                            if (finished) return;
                            auto const tl = static_cast<std::ptrdiff_t>(j->token_len);
                            if (e3) return refuse(j->sock, "closed during its handshake");
                            if (std::string(j->rest.begin(), j->rest.begin() + tl) != cfg_.job_token)
                                return refuse(j->sock, "wrong job token");
                            if (joined[j->rank])
                                return refuse(j->sock, "rank " + std::to_string(j->rank) + " has already joined");
                            j->addr.assign(j->rest.begin() + tl, j->rest.end());
                            joined[j->rank] = j;
                            if (++joined_count == n) send_tables();
                        });
                    });
                });
            };
            accept_hello();
        }

        // Every rank: hello to the master, with retry and back-off.
        tcp::socket to_master(io_);
        tcp::endpoint const master_ep(master_ip, cfg_.master_port);
        std::vector<unsigned char> hello;
        std::array<unsigned char, 8> table_len{};
        std::vector<unsigned char> table_in;
        bool have_table = false;
        std::vector<tcp::endpoint> endpoints(n);
        std::size_t connected = 0;
        auto backoff = std::chrono::milliseconds(5);

        std::function<void(rank_t, std::chrono::milliseconds)> connect_mesh = [&](rank_t q, std::chrono::milliseconds wait) {
            auto peer = std::make_shared<tcp_peer>(io_);
            peer->rank = q;
            peer->sock.async_connect(endpoints[static_cast<std::size_t>(q)], [&, peer, q, wait](asio::error_code e) {
                if (finished) return;
                if (e) {
                    auto& t = timers.emplace_back(io_, wait);
                    t.async_wait([&, q, wait](asio::error_code te) {
                        if (!finished && !te) connect_mesh(q, std::min(wait * 2, std::chrono::milliseconds(200)));
                    });
                    return;
                }
                tune_socket(peer->sock);
                auto hs = std::make_shared<std::vector<unsigned char>>();
                tcp_wire::append64(*hs, tcp_wire::mesh_magic);
                tcp_wire::append64(*hs, static_cast<std::uint64_t>(me));
                tcp_wire::append64(*hs, cfg_.job_token.size());
                tcp_wire::append(*hs, cfg_.job_token);
                asio::async_write(peer->sock, asio::buffer(*hs), [&, peer, hs, q](asio::error_code e2, std::size_t) {
                    if (finished) return;
                    if (e2) {
                        fatal = "rank " + std::to_string(me) + ": handshake with rank " + std::to_string(q) +
                                " failed: " + e2.message();
                        return;
                    }
                    auto owned = std::make_unique<tcp_peer>(io_);
                    owned->rank = q;
                    owned->sock = std::move(peer->sock);
                    peers_[static_cast<std::size_t>(q)] = std::move(owned);
                    ++connected;
                });
            });
        };

        auto on_table = [&] {
            std::size_t off = 0;
            for (std::size_t q = 0; q < n; ++q) {
                if (off + 16 > table_in.size()) return void(fatal = "rank " + std::to_string(me) + ": bad rendezvous table");
                auto const port = tcp_wire::get64(table_in.data() + off);
                auto const len = static_cast<std::size_t>(tcp_wire::get64(table_in.data() + off + 8));
                off += 16;
                if (off + len > table_in.size() || port > 65535)
                    return void(fatal = "rank " + std::to_string(me) + ": bad rendezvous table");
                std::string const addr(reinterpret_cast<char const*>(table_in.data() + off), len);
                off += len;
                asio::error_code e;
                auto const ip = asio::ip::make_address(addr, e);
                if (e) return void(fatal = "rank " + std::to_string(me) + ": bad address in rendezvous table: " + addr);
                endpoints[q] = tcp::endpoint(ip, static_cast<std::uint16_t>(port));
            }
            have_table = true;
            asio::error_code ignore;
            to_master.close(ignore);
            for (rank_t q = 0; q < me; ++q) connect_mesh(q, std::chrono::milliseconds(5));
        };

        std::function<void()> connect_master = [&] {
            to_master.async_connect(master_ep, [&](asio::error_code e) {
                if (finished) return;
                if (e) {
                    asio::error_code ignore;
                    to_master.close(ignore);
                    auto& t = timers.emplace_back(io_, backoff);
                    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
                    t.async_wait([&](asio::error_code te) {
                        if (!finished && !te) connect_master();
                    });
                    return;
                }
                asio::error_code le;
                std::string const addr =
                    advertised.empty() ? to_master.local_endpoint(le).address().to_string() : advertised;
                hello.clear();
                tcp_wire::append64(hello, tcp_wire::hello_magic);
                tcp_wire::append64(hello, static_cast<std::uint64_t>(me));
                tcp_wire::append64(hello, n);
                tcp_wire::append64(hello, my_port);
                tcp_wire::append64(hello, cfg_.job_token.size());
                tcp_wire::append64(hello, addr.size());
                tcp_wire::append(hello, cfg_.job_token);
                tcp_wire::append(hello, addr);
                asio::async_write(to_master, asio::buffer(hello), [&](asio::error_code e2, std::size_t) {
                    if (finished) return;
                    if (e2) return void(fatal = "rank " + std::to_string(me) + ": hello to the master failed: " + e2.message());
                    asio::async_read(to_master, asio::buffer(table_len), [&](asio::error_code e3, std::size_t) {
                        if (finished) return;
                        auto const len = tcp_wire::get64(table_len.data());
                        if (e3 || len > (std::uint64_t{1} << 24))
                            return void(fatal = "rank " + std::to_string(me) + ": no rendezvous table from the master at " +
                                                where + ": " + (e3 ? e3.message() : std::string("bad length")));
                        table_in.resize(static_cast<std::size_t>(len));
                        asio::async_read(to_master, asio::buffer(table_in), [&](asio::error_code e4, std::size_t) {
                            if (finished) return;
                            if (e4) return void(fatal = "rank " + std::to_string(me) + ": rendezvous table from the master at " +
                                                        where + " cut short: " + e4.message());
                            on_table();
                        });
                    });
                });
            });
        };
        connect_master();

        auto const complete = [&] {
            return have_table && connected == static_cast<std::size_t>(me) && accepted == n - 1 - static_cast<std::size_t>(me) &&
                   (me != 0 || tables_sent == n);
        };
        while (!complete() && fatal.empty()) {
            if (io_.run_one_until(deadline) == 0) break;
        }
        bool const ok = complete() && fatal.empty();

        // Drain: every handler above sees `finished` and starts nothing new.
        finished = true;
        {
            asio::error_code ignore;
            listener.close(ignore);
            if (master) master->close(ignore);
            to_master.close(ignore);
            for (auto& t : timers) t.cancel();
            for (auto& m : mesh_pending) m->sock.close(ignore);
            for (auto& j : master_pending) j->sock.close(ignore);
            if (!ok)
                for (auto& peer : peers_)
                    if (peer) peer->sock.close(ignore);
        }
        io_.restart();
        io_.run();
        if (ok) return;
        for (auto& peer : peers_) peer.reset();
        if (!fatal.empty()) throw transport_error(errc::connection_failed, -1, fatal);

        std::string const after = " after " + std::to_string(cfg_.timeout.count()) + " ms";
        if (me == 0 && joined_count < n) {
            std::string missing;
            rank_t first = -1;
            for (std::size_t q = 0; q < n; ++q)
                if (!joined[q]) {
                    if (first < 0) first = static_cast<rank_t>(q);
                    missing += (missing.empty() ? "" : ", ") + std::to_string(q);
                }
            throw timeout_error(first, "rank 0: rendezvous on " + where + " timed out" + after +
                                           "; ranks that never joined: " + missing);
        }
        if (!have_table)
            throw timeout_error(0, "rank " + std::to_string(me) + ": rendezvous timed out" + after +
                                       " waiting for the table from the master (rank 0) at " + where);
        std::string missing;
        rank_t first = -1;
        for (std::size_t q = 0; q < n; ++q)
            if (q != static_cast<std::size_t>(me) && !peers_[q]) {
                if (first < 0) first = static_cast<rank_t>(q);
                missing += (missing.empty() ? "" : ", ") + std::to_string(q);
            }
        if (first < 0) first = 0;
        throw timeout_error(first, "rank " + std::to_string(me) + ": connecting the mesh timed out" + after +
                                       "; no connection with ranks: " + missing);
    }

    // This rank's listening socket: any free port, or the first free one of the configured
    // range (starting at an offset by rank, so that ranks of one host do not all race for the
    // same port).
    void bind_listener(asio::ip::tcp::acceptor& listener, asio::ip::tcp family) {
        using asio::ip::tcp;
        std::string const who = "rank " + std::to_string(cfg_.rank);
        asio::error_code ec;
        listener.open(family, ec);
        if (ec) throw transport_error(errc::connection_failed, cfg_.rank, who + ": cannot open a listening socket: " + ec.message());
        if (cfg_.port_max == 0) {
            listener.bind(tcp::endpoint(family, 0), ec);
        } else {
            unsigned const span = unsigned{cfg_.port_max} - cfg_.port_min + 1;
            for (unsigned i = 0; i < span; ++i) {
                auto const port = static_cast<std::uint16_t>(cfg_.port_min + (static_cast<unsigned>(cfg_.rank) + i) % span);
                listener.bind(tcp::endpoint(family, port), ec);
                if (!ec) break;
            }
        }
        if (!ec) listener.listen(asio::socket_base::max_listen_connections, ec);
        if (ec)
            throw transport_error(errc::connection_failed, cfg_.rank,
                                  who + ": cannot listen on " +
                                      (cfg_.port_max == 0 ? std::string("an ephemeral port")
                                                          : "any port of " + std::to_string(cfg_.port_min) + "-" +
                                                                std::to_string(cfg_.port_max)) +
                                      ": " + ec.message());
    }

    // The launcher's already listening master socket (see tcp_config::master_fd).
    void adopt_master(asio::ip::tcp::acceptor& master) {
        int const fd = std::exchange(cfg_.master_fd, -1);
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        int listening = 0;
        socklen_t optlen = sizeof listening;
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
            (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) ||
            ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || !listening) {
            ::close(fd);
            throw transport_error(errc::connection_failed, 0,
                                  "rank 0: CHORUS_MASTER_FD " + std::to_string(fd) + " is not a listening TCP socket");
        }
        asio::error_code ec;
        master.assign(addr.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), fd, ec);
        if (ec) {
            ::close(fd);
            throw transport_error(errc::connection_failed, 0, "rank 0: cannot use CHORUS_MASTER_FD: " + ec.message());
        }
    }

    tcp_config cfg_;
    // io_ first: sockets (in peers_) must be destroyed before their io_context.
    asio::io_context io_;
    std::vector<std::unique_ptr<tcp_peer>> peers_;  // null for self
    std::uint64_t sequence_ = 0;
    std::vector<std::list<std::shared_ptr<tcp_op>>> posted_;  // per sender, in posting order
    std::vector<std::deque<tcp_unexpected>> unexpected_;      // per sender, in arrival order
    std::vector<pollfd> fds_;      // poll_once's scratch, kept to avoid an allocation per wait
    std::vector<tcp_peer*> ready_;
    bool failed_ = false;
    bool flushing_ = false;  // flush() or shutdown() drive the sockets of a failed group
    bool shut_ = false;
    rank_t failed_rank_ = -1;
    std::string failure_;
};



CHORUS_TCP_DECL tcp_engine::tcp_engine(tcp_config config) : state_(std::make_unique<tcp_state>(std::move(config))) {}
CHORUS_TCP_DECL tcp_engine::~tcp_engine() = default;
CHORUS_TCP_DECL rank_t tcp_engine::rank() const noexcept { return state_->rank(); }
CHORUS_TCP_DECL rank_t tcp_engine::size() const noexcept { return state_->size(); }
CHORUS_TCP_DECL rank_t tcp_engine::local_rank() const noexcept { return state_->local_rank(); }
CHORUS_TCP_DECL std::chrono::milliseconds tcp_engine::timeout() const noexcept { return state_->timeout(); }
CHORUS_TCP_DECL std::uint64_t tcp_engine::next_sequence() noexcept { return state_->next_sequence(); }
CHORUS_TCP_DECL std::shared_ptr<tcp_op> tcp_engine::isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
    return state_->isend(peer, tag, bytes);
}
CHORUS_TCP_DECL std::shared_ptr<tcp_op> tcp_engine::irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
    return state_->irecv(peer, tag, bytes);
}
CHORUS_TCP_DECL void tcp_engine::wait(std::shared_ptr<tcp_op> const& op) { state_->wait(op); }
CHORUS_TCP_DECL bool tcp_engine::test(std::shared_ptr<tcp_op> const& op) { return state_->test(op); }
CHORUS_TCP_DECL void tcp_engine::cancel(std::shared_ptr<tcp_op> const& op) noexcept { state_->cancel(op); }
CHORUS_TCP_DECL void tcp_engine::abort(std::string const& reason) noexcept { state_->abort(reason); }

} // namespace detail
} // namespace chorus
