// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_transport: one rank per process (or per thread, in tests), ranks connected by a full
// mesh of TCP connections, on standalone Asio (define ASIO_STANDALONE; header <asio.hpp>).
//
// This header is light: the configuration, tcp_transport and its engine's interface. The
// engine — rendezvous, wire protocol, progress — is in <chorus/transport/tcp_impl.hpp>, which
// needs Asio and is most of a TU's compile time (12 of 15 s at -O2 here). By default this
// header includes it and everything is inline. A program that defines
// CHORUS_TCP_SEPARATE_COMPILATION (in every TU) instead compiles it once, by including
// <chorus/transport/tcp_impl.hpp> in one .cpp file, as Asio's ASIO_SEPARATE_COMPILATION does.
// The protocol and the progress rules are described there.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include <chorus/detail/request_handle.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>

#if defined(CHORUS_TCP_SEPARATE_COMPILATION)
#define CHORUS_TCP_DECL
#else
#define CHORUS_TCP_DECL inline
#endif

namespace chorus {

struct tcp_config {
    rank_t rank = 0;
    rank_t size = 1;
    /// This rank's index among the ranks of its node (LOCAL_RANK); chorus itself does not use
    /// it, device transports and users do (e.g. to pick a GPU).
    rank_t local_rank = 0;
    /// Host name or address literal of rank 0; IPv6 literals may be bracketed ("[::1]").
    std::string master_addr = "127.0.0.1";
    std::uint16_t master_port = 0;
    /// Rank 0 only: an already listening socket for the rendezvous, handed down by a launcher
    /// (CHORUS_MASTER_FD) that bound it, so there is no window in which the port could be taken.
    /// Owned by the transport from then on. -1: bind master_addr:master_port instead.
    int master_fd = -1;
    /// The address this rank tells the others to connect to. Empty: the address of the
    /// interface named by socket_ifname, else the local address of the connection to the master
    /// (the interface the route to the master uses).
    std::string advertise_addr;
    /// Interface whose address is advertised (CHORUS_SOCKET_IFNAME), e.g. "eth1".
    std::string socket_ifname;
    /// Port range [port_min, port_max] for this rank's listening socket (CHORUS_PORT_RANGE), for
    /// sites whose firewall opens only some ports. Both 0: any ephemeral port.
    std::uint16_t port_min = 0, port_max = 0;
    /// Bounds every wait, the rendezvous, and the goodbye exchange at shutdown.
    std::chrono::milliseconds timeout{30000};
    /// How long a wait polls (yielding the core in between) before it blocks (CHORUS_SPIN_US).
    /// On an idle host a blocked ppoll wakes up late — a sleeping core takes tens of
    /// microseconds: 170 us per 8-byte allreduce on the 2-core CI VM, against 13 us spinning —
    /// and on a busy one the sched_yield hands the core to whichever rank has work. 50 us covers
    /// a small message's round trip on loopback; 0 never spins.
    std::chrono::microseconds spin{50};
    /// Must be equal on all ranks of a job; connections with another token are ignored.
    std::string job_token;
    /// Called by rank 0 once its master socket is listening, with the bound port. With
    /// master_port 0 the system picks a free port: tests pass it to the other ranks this way.
    std::function<void(std::uint16_t)> on_master_listening;
};

namespace detail {

struct tcp_op;
class tcp_state;

/// tcp_transport's state behind a compilation firewall: its members are defined in
/// tcp_impl.hpp, so that separate compilation keeps Asio out of every other TU.
class tcp_engine {
public:
    CHORUS_TCP_DECL explicit tcp_engine(tcp_config config);
    CHORUS_TCP_DECL ~tcp_engine();
    tcp_engine(tcp_engine const&) = delete;
    tcp_engine& operator=(tcp_engine const&) = delete;

    CHORUS_TCP_DECL rank_t rank() const noexcept;
    CHORUS_TCP_DECL rank_t size() const noexcept;
    CHORUS_TCP_DECL rank_t local_rank() const noexcept;
    CHORUS_TCP_DECL std::chrono::milliseconds timeout() const noexcept;
    CHORUS_TCP_DECL std::uint64_t next_sequence() noexcept;
    /// Null when the send completed at once.
    CHORUS_TCP_DECL std::shared_ptr<tcp_op> isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes);
    CHORUS_TCP_DECL std::shared_ptr<tcp_op> irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes);
    CHORUS_TCP_DECL void wait(std::shared_ptr<tcp_op> const& op);
    CHORUS_TCP_DECL bool test(std::shared_ptr<tcp_op> const& op);
    CHORUS_TCP_DECL void cancel(std::shared_ptr<tcp_op> const& op) noexcept;
    CHORUS_TCP_DECL void abort(std::string const& reason) noexcept;

private:
    std::unique_ptr<tcp_state> state_;
};

inline std::string env_or(char const* name, char const* fallback1 = nullptr, char const* fallback2 = nullptr) {
    for (char const* n : {name, fallback1, fallback2})
        if (n)
            if (char const* v = std::getenv(n); v && *v) return v;
    return {};
}

inline long long parse_env_number(std::string const& value, char const* what) {
    try {
        std::size_t used = 0;
        long long const v = std::stoll(value, &used);
        if (used != value.size()) throw std::invalid_argument(what);
        return v;
    } catch (std::exception const&) {
        throw invalid_argument(std::string("tcp_transport::from_env: ") + what + " is not a number: '" + value + "'");
    }
}

inline std::uint16_t parse_env_port(std::string const& value, char const* what) {
    long long const p = parse_env_number(value, what);
    if (p < 1 || p > 65535)
        throw invalid_argument(std::string("tcp_transport::from_env: ") + what + " out of range: " + value);
    return static_cast<std::uint16_t>(p);
}

/// The first host of a Slurm node list: "node[07-09,12],gpu3" -> "node07".
inline std::string first_slurm_host(std::string const& list) {
    std::size_t const end = list.find_first_of(",[");
    if (end == std::string::npos || list[end] == ',') return list.substr(0, end);
    std::size_t const close = list.find(']', end);
    std::size_t const item_end = list.find_first_of("-,]", end + 1);
    if (close == std::string::npos || item_end == std::string::npos) return {};
    std::string host = list.substr(0, end) + list.substr(end + 1, item_end - end - 1);
    // A suffix after the bracket ("rack[1-2]-node") belongs to every host.
    std::size_t const suffix_end = list.find_first_of(",[", close + 1);
    return host + list.substr(close + 1, suffix_end == std::string::npos ? std::string::npos : suffix_end - close - 1);
}

} // namespace detail

/// One rank of a TCP group. Move-only; one thread drives it (as with any transport).
class tcp_transport {
public:
    using memory_space = host_memory;

    using request = detail::request_handle<detail::tcp_engine, detail::tcp_op>;

    /// Rendezvous and mesh set-up; blocks until every rank joined or the timeout passed.
    explicit tcp_transport(tcp_config config) : state_(std::make_unique<detail::tcp_engine>(std::move(config))) {}

    /// The configuration a launcher describes in the environment (torchrun's names first):
    /// - RANK, WORLD_SIZE, LOCAL_RANK; else Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID;
    ///   else Open MPI's OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK;
    /// - MASTER_ADDR (else the first host of SLURM_JOB_NODELIST, else 127.0.0.1; "[::1]" is
    ///   accepted), MASTER_PORT (required, except under Slurm, where 10000 + SLURM_JOB_ID % 50000
    ///   gives every job its own);
    /// - CHORUS_JOB_TOKEN, CHORUS_TIMEOUT_MS, CHORUS_SPIN_US, CHORUS_SOCKET_IFNAME, CHORUS_PORT_RANGE ("lo-hi"),
    ///   and, for rank 0, CHORUS_MASTER_FD (set by chorusrun).
    /// Throws invalid_argument naming the variables that are missing or malformed.
    static tcp_config config_from_env() {
        using detail::env_or;
        tcp_config c;
        std::string const rank = env_or("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK");
        std::string const size = env_or("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE");
        std::string const port = env_or("MASTER_PORT");
        std::string const slurm_job = env_or("SLURM_JOB_ID");
        std::string missing;
        if (rank.empty()) missing += " RANK (or SLURM_PROCID, OMPI_COMM_WORLD_RANK)";
        if (size.empty()) missing += " WORLD_SIZE (or SLURM_NTASKS, OMPI_COMM_WORLD_SIZE)";
        if (port.empty() && slurm_job.empty()) missing += " MASTER_PORT";
        if (!missing.empty()) throw invalid_argument("tcp_transport::from_env: missing environment variables:" + missing);
        c.rank = static_cast<rank_t>(detail::parse_env_number(rank, "RANK"));
        c.size = static_cast<rank_t>(detail::parse_env_number(size, "WORLD_SIZE"));
        if (std::string l = env_or("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"); !l.empty())
            c.local_rank = static_cast<rank_t>(detail::parse_env_number(l, "LOCAL_RANK"));
        c.master_port = !port.empty() ? detail::parse_env_port(port, "MASTER_PORT")
                                      : static_cast<std::uint16_t>(10000 + detail::parse_env_number(slurm_job, "SLURM_JOB_ID") % 50000);
        if (std::string a = env_or("MASTER_ADDR"); !a.empty())
            c.master_addr = a;
        else if (std::string nodes = env_or("SLURM_JOB_NODELIST", "SLURM_NODELIST"); !nodes.empty())
            c.master_addr = detail::first_slurm_host(nodes);
        c.job_token = env_or("CHORUS_JOB_TOKEN");
        if (std::string t = env_or("CHORUS_TIMEOUT_MS"); !t.empty()) {
            long long const ms = detail::parse_env_number(t, "CHORUS_TIMEOUT_MS");
            if (ms <= 0) throw invalid_argument("tcp_transport::from_env: CHORUS_TIMEOUT_MS must be positive: " + t);
            c.timeout = std::chrono::milliseconds(ms);
        }
        if (std::string t = env_or("CHORUS_SPIN_US"); !t.empty()) {
            long long const us = detail::parse_env_number(t, "CHORUS_SPIN_US");
            if (us < 0) throw invalid_argument("tcp_transport::from_env: CHORUS_SPIN_US must not be negative: " + t);
            c.spin = std::chrono::microseconds(us);
        }
        c.socket_ifname = env_or("CHORUS_SOCKET_IFNAME");
        if (std::string r = env_or("CHORUS_PORT_RANGE"); !r.empty()) {
            std::size_t const dash = r.find_first_of("-:");
            if (dash == std::string::npos)
                throw invalid_argument("tcp_transport::from_env: CHORUS_PORT_RANGE must be LOW-HIGH: '" + r + "'");
            c.port_min = detail::parse_env_port(r.substr(0, dash), "CHORUS_PORT_RANGE");
            c.port_max = detail::parse_env_port(r.substr(dash + 1), "CHORUS_PORT_RANGE");
            if (c.port_min > c.port_max)
                throw invalid_argument("tcp_transport::from_env: CHORUS_PORT_RANGE is empty: '" + r + "'");
        }
        if (std::string fd = env_or("CHORUS_MASTER_FD"); !fd.empty() && c.rank == 0)
            c.master_fd = static_cast<int>(detail::parse_env_number(fd, "CHORUS_MASTER_FD"));
        return c;
    }

    /// tcp_transport(config_from_env()): joins the job a launcher (chorusrun, torchrun, srun,
    /// mpirun) started.
    static tcp_transport from_env() { return tcp_transport(config_from_env()); }

    rank_t rank() const noexcept { return state_->rank(); }
    rank_t size() const noexcept { return state_->size(); }
    rank_t local_rank() const noexcept { return state_->local_rank(); }
    std::chrono::milliseconds timeout() const noexcept { return state_->timeout(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return {state_.get(), state_->isend(peer, tag, bytes)};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return {state_.get(), state_->irecv(peer, tag, bytes)};
    }
    std::uint64_t next_sequence() noexcept { return state_->next_sequence(); }
    void abort(char const* reason) noexcept {
        try {
            state_->abort(reason ? reason : "aborted");
        } catch (...) {
        }
    }

private:
    std::unique_ptr<detail::tcp_engine> state_;
};

} // namespace chorus

#if !defined(CHORUS_TCP_SEPARATE_COMPILATION)
#include <chorus/transport/tcp_impl.hpp>
#endif
