// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The seam between tcp_transport (tcp.hpp, light) and its engine (engine.hpp, Asio): what the
// transport calls, and the function that builds the engine, compiled inline or once
// (CHORUS_TCP_SEPARATE_COMPILATION, see tcp.hpp).

#include <memory>
#include <span>
#include <string>

#include <chorus/fwd.hpp>
#include <chorus/transport/tcp/config.hpp>

#if defined(CHORUS_TCP_SEPARATE_COMPILATION)
#define CHORUS_TCP_DECL
#else
#define CHORUS_TCP_DECL inline
#endif

namespace chorus::detail {

struct tcp_op;
class companion;

/// What tcp_transport asks of its engine (tcp/engine.hpp). An interface, so that the engine,
/// which needs Asio, can be compiled once: a virtual call costs nothing next to a system call.
class tcp_engine {
public:
    virtual ~tcp_engine() = default;
    /// Null when the send completed at once.
    virtual std::shared_ptr<tcp_op> isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) = 0;
    virtual std::shared_ptr<tcp_op> irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) = 0;
    virtual void wait(std::shared_ptr<tcp_op> const& op) = 0;
    virtual bool test(std::shared_ptr<tcp_op> const& op) = 0;
    virtual void cancel(std::shared_ptr<tcp_op> const& op) noexcept = 0;
    virtual void abort(std::string const& reason) noexcept = 0;
    virtual tcp_stats stats() const noexcept = 0;

    // For node_transport, which joins this engine to a shared-memory one (detail/companion.hpp).
    /// The engine this one drives while it waits; null: none.
    virtual void set_companion(companion* c) noexcept = 0;
    /// One non-blocking round: every connection read and written, liveness checked.
    virtual void drive() = 0;
    /// Whether a send is not wholly written or a receive is posted.
    virtual bool busy() const noexcept = 0;
    /// Whether the group failed; if so, whom it blames and why.
    virtual bool failure(rank_t& blamed, std::string& reason) const = 0;
    /// Fails the group blaming `blamed`, told to every peer (a failure another engine found).
    virtual void fail(rank_t blamed, std::string const& reason) noexcept = 0;
};

/// The rendezvous, then the engine over the mesh it formed (tcp_impl.hpp).
CHORUS_TCP_DECL std::unique_ptr<tcp_engine> connect_tcp(tcp_config config);

} // namespace chorus::detail
