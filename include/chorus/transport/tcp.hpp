// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_transport: one rank per process (or per thread, in tests), ranks connected by a full
// mesh of TCP connections, on standalone Asio (define ASIO_STANDALONE; header <asio.hpp>).
//
// This header is light: the configuration (tcp/config.hpp), tcp_transport and the interface
// of its engine (tcp/interface.hpp). The engine is in parts under tcp/: the wire format
// (wire.hpp), the rendezvous that forms the mesh (rendezvous.hpp, with gate.hpp and net.hpp),
// and the engine that moves messages (engine.hpp, connection.hpp); they need Asio and are most
// of a TU's compile time (12 of 15 s at -O2 here).
// By default this header includes them (through tcp_impl.hpp) and everything is inline. A
// program that defines CHORUS_TCP_SEPARATE_COMPILATION (in every TU) instead compiles them
// once, by including <chorus/transport/tcp_impl.hpp> in one .cpp file, as Asio's
// ASIO_SEPARATE_COMPILATION does.

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include <chorus/detail/request_handle.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/tcp/config.hpp>
#include <chorus/transport/tcp/interface.hpp>

namespace chorus {

namespace detail {
class node_mesh;
}

/// One rank of a TCP group. Move-only; one thread drives it (as with any transport).
class tcp_transport {
public:
    using memory_space = host_memory;

    using request = detail::request_handle<detail::tcp_engine, detail::tcp_op>;

    /// Ring allreduce segments (detail::ring_segment_bytes_of): 1 MiB, not the default 256 KiB.
    /// Every message costs a sendmsg, a recv and a poll round on each side; measured on the
    /// 2-core VM (2026-12-05, two interleaved runs), 1 MiB segments were 1.1-1.25x faster at 2
    /// ranks (4 MiB: 0.81 ms against 0.97-1.05; 64 MiB: 17.9-18.4 ms against 20.2-20.3) and
    /// 1.18x at 4 ranks and 16 MiB, and 4 MiB segments slower again (too little pipelining).
    static constexpr std::size_t ring_segment_bytes = std::size_t{1} << 20;

    /// Rendezvous and mesh set-up; blocks until every rank joined or the timeout passed.
    explicit tcp_transport(tcp_config config)
        : rank_(config.rank), size_(config.size), local_rank_(config.local_rank), timeout_(config.timeout),
          engine_(detail::connect_tcp(std::move(config))) {}

    tcp_transport(tcp_transport&& other) noexcept = default;
    tcp_transport& operator=(tcp_transport&& other) noexcept {
        if (this != &other) {
            leave();
            rank_ = other.rank_;
            size_ = other.size_;
            local_rank_ = other.local_rank_;
            timeout_ = other.timeout_;
            sequence_ = other.sequence_;
            engine_ = std::move(other.engine_);
            unwinding_ = std::uncaught_exceptions();
        }
        return *this;
    }

    /// Leaves the group: a goodbye to every peer, whose waits for this rank then fail naming
    /// it ("rank 2 left the group"). Destroyed by an exception unwinding the stack (a check of
    /// the user's that threw), it aborts the group instead: the peers fail at once, with the
    /// reason, rather than at their next wait for this rank.
    ~tcp_transport() { leave(); }

    /// tcp_config_from_env(): the launcher's variables and CHORUS_* settings.
    static tcp_config config_from_env() { return tcp_config_from_env("tcp_transport::from_env"); }

    /// tcp_transport(config_from_env()): joins the job a launcher (chorusrun, torchrun, srun,
    /// mpirun) started.
    static tcp_transport from_env() { return tcp_transport(config_from_env()); }

    rank_t rank() const noexcept { return rank_; }
    rank_t size() const noexcept { return size_; }
    rank_t local_rank() const noexcept { return local_rank_; }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return {engine_.get(), engine_->isend(peer, tag, bytes)};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return {engine_.get(), engine_->irecv(peer, tag, bytes)};
    }
    std::uint64_t next_sequence() noexcept { return sequence_++; }
    /// Counters of this rank's socket calls, bytes and waiting (tcp_stats), since it joined.
    tcp_stats stats() const noexcept { return engine_ ? engine_->stats() : tcp_stats{}; }
    void abort(char const* reason) noexcept {
        try {
            if (engine_) engine_->abort(reason ? reason : "aborted");
        } catch (...) {  // the reason's copy failed to allocate: the group stays as it was
        }
    }

private:
    friend class detail::node_mesh;  // joins this engine to a shared-memory one (transport/node.hpp)

    void leave() noexcept {
        if (engine_ && std::uncaught_exceptions() > unwinding_) {
            try {
                engine_->abort(detail::left_by_exception_message(rank_));
            } catch (...) {  // no memory for the text: the peers see the connection close
            }
        }
        engine_.reset();
    }

    rank_t rank_, size_, local_rank_;
    std::chrono::milliseconds timeout_;
    std::uint64_t sequence_ = 0;
    std::unique_ptr<detail::tcp_engine> engine_;
    int unwinding_ = std::uncaught_exceptions();  // exceptions in flight where this transport was made
};

} // namespace chorus

#if !defined(CHORUS_TCP_SEPARATE_COMPILATION)
#include <chorus/transport/tcp_impl.hpp>
#endif
