// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The rendezvous's gate: connections its listeners accepted, until each proved to be a rank of
// this job or was refused. A port scanner, another job's rank or a wrong token is closed and
// logged, and the job goes on. A connection has a few seconds to complete its handshake, and
// those that have not are capped (the oldest closed first), so that silent connections cannot
// use up the process's file descriptors; an accept that fails (out of descriptors, a connection
// reset while queued) is retried, never the end of a listener.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <sys/resource.h>  // getrlimit: how many connections may wait for a handshake

#include <chorus/fwd.hpp>
#include <chorus/transport/tcp/net.hpp>
#include <chorus/transport/tcp/wire.hpp>

namespace chorus::detail {

/// An accepted connection; settled once it proved to be a rank of the job, or was refused.
struct tcp_incoming {
    explicit tcp_incoming(asio::io_context& io) : sock(io) {}
    asio::ip::tcp::socket sock;
    tcp_wire::challenge challenge = tcp_wire::make_challenge();  // sent at once; the handshake answers it
    std::string from;  // "address port N", noted at accept: a reset connection no longer knows it
    std::chrono::steady_clock::time_point admitted{};  // when the gate took it in
    bool settled = false;
};

class tcp_gate {
public:
    /// Each connection of rank `me` gets `grace` to complete its handshake.
    tcp_gate(asio::io_context& io, rank_t me, std::chrono::milliseconds grace) : timers_(io), me_(me), grace_(grace) {}

    /// A connection was accepted: its deadline starts; over the cap, the oldest stranger goes.
    void admit(std::shared_ptr<tcp_incoming> const& c) {
        asio::error_code e;
        auto const peer = c->sock.remote_endpoint(e);
        if (!e) c->from = peer.address().to_string() + " port " + std::to_string(peer.port());
        c->admitted = std::chrono::steady_clock::now();
        prune();
        strangers_.push_back(c);
        if (strangers_.size() > cap()) refuse(over_cap(*c), "too many connections without a handshake");
        timers_.after(grace_, [this, c] {
            if (!c->settled) refuse(*c, "no handshake within " + std::to_string(grace_.count()) + " ms");
        });
    }

    /// Logs why and closes `c`, unless it was settled already (its pending read then ends too).
    /// With a `farewell` (a refusal a rank is to read), that is written first and only the
    /// sending side is shut: closing a socket with unread input resets the connection, which
    /// could destroy the farewell; it is closed when the rendezvous is over.
    void refuse(tcp_incoming& c, std::string const& why, std::vector<unsigned char> const& farewell = {}) {
        if (c.settled) return;
        c.settled = true;
        asio::error_code e;
        std::string const who = c.from.empty() ? std::string("an unknown peer") : c.from;
        std::fprintf(stderr, "chorus: rank %d: refused a connection from %s: %s\n", me_, who.c_str(), why.c_str());
        if (farewell.empty()) {
            c.sock.close(e);
            return;
        }
        tell(c.sock, farewell);
        c.sock.shutdown(asio::ip::tcp::socket::shutdown_send, e);
        lingering_.push_back(std::move(c.sock));
    }

    /// accept() failed: said once; out of descriptors or memory, the oldest stranger is closed
    /// to free one (another error, such as a connection reset while queued, closes nothing);
    /// `again` in 10 ms.
    template <class Again>
    void accept_failed(asio::error_code e, Again again) {
        if (!failure_said_)
            std::fprintf(stderr, "chorus: rank %d: accepting a connection failed: %s; still accepting\n", me_, e.message().c_str());
        failure_said_ = true;
        prune();
        bool const starved = e == asio::error::no_descriptors || e == asio::error::no_buffer_space ||
                             e == asio::error::no_memory || e.value() == ENFILE;
        if (starved && !strangers_.empty()) refuse(oldest_silent(), "closed to free a file descriptor");
        timers_.after(std::chrono::milliseconds(10), std::move(again));
    }

    /// The rendezvous is over: strangers are closed, deadlines cancelled.
    void close_all() noexcept {
        asio::error_code ignore;
        for (auto& c : strangers_) c->sock.close(ignore);
        for (auto& sock : lingering_) sock.close(ignore);
        timers_.cancel_all();
    }

private:
    void prune() {
        std::erase_if(strangers_, [](auto const& c) { return c->settled; });
    }

    // The stranger to close first: the oldest that said nothing yet. A rank whose handshake is
    // in the socket, not yet read (a loaded master reads it a little later), is not silent:
    // closing it would fail the job for a flood it took no part in. All said something: the
    // oldest. Pre: strangers_ is not empty.
    tcp_incoming& oldest_silent() {
        for (auto const& c : strangers_)
            if (silent(*c)) return *c;
        return *strangers_.front();
    }

    // Over the cap after admitting `newest`: the oldest stranger silent for longer than a
    // handshake takes (handshake_allowance), else `newest` itself. A rank connected just
    // before a burst of silent connections is silent too until its answer to the challenge
    // arrives — tens of milliseconds on a loaded machine, where the flood test closed it as
    // the oldest and failed the job; a burst now turns its own latest away instead, and once
    // its connections are that old, they go first, so a rank that comes later gets in.
    tcp_incoming& over_cap(tcp_incoming& newest) {
        auto const now = std::chrono::steady_clock::now();
        for (auto const& c : strangers_)
            if (silent(*c) && now - c->admitted >= handshake_allowance()) return *c;
        return newest;
    }

    std::chrono::milliseconds handshake_allowance() const noexcept { return std::min(grace_ / 2, std::chrono::milliseconds(1000)); }

    static bool silent(tcp_incoming const& c) {
        asio::error_code e;
        return c.sock.available(e) == 0 || e;
    }

    // A quarter of the descriptors this process may open (at least 16).
    static std::size_t cap() noexcept {
        rlimit l{};
        if (::getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return 1024;
        return std::max<std::size_t>(16, static_cast<std::size_t>(l.rlim_cur) / 4);
    }

    tcp_timers timers_;  // deadlines and retries, none after close_all()
    rank_t me_;
    std::chrono::milliseconds grace_;
    std::list<std::shared_ptr<tcp_incoming>> strangers_;  // by age; settled ones pruned
    std::list<asio::ip::tcp::socket> lingering_;  // refused ranks' sockets, their refusal on its way
    bool failure_said_ = false;
};

} // namespace chorus::detail
