// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_config: what a TCP group needs to know to form (rendezvous, addresses, ports, timeouts),
// and tcp_config_from_env(), the same read from the variables a launcher sets.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <chorus/detail/env.hpp>
#include <chorus/fwd.hpp>

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
    /// Bounds every wait of a send or receive (CHORUS_TIMEOUT_MS). 0: waits are not bounded
    /// (long jobs whose ranks drift far apart); liveness (heartbeat) still finds a dead or
    /// stopped rank, and the rendezvous and shutdown keep the default bound.
    std::chrono::milliseconds timeout{30000};
    /// Liveness (CHORUS_HEARTBEAT_MS): every connection carries a heartbeat this often, sent by
    /// a thread of the transport whatever its owner is doing, and a rank that hears nothing from
    /// a peer for five of these while it waits in the transport fails the group naming that
    /// peer (stopped, hung in the kernel, or its host unreachable). The kernel's keepalive and
    /// TCP_USER_TIMEOUT back it up. 0: no heartbeats (the collective timeout alone).
    std::chrono::milliseconds heartbeat{1000};
    /// How long a wait polls (yielding the core in between) before it blocks (CHORUS_SPIN_US).
    /// On an idle host a blocked ppoll wakes up late — a sleeping core takes tens of
    /// microseconds: 170 us per 8-byte allreduce on the 2-core CI VM, against 13 us spinning —
    /// and on a busy one the sched_yield hands the core to whichever rank has work. 50 us covers
    /// a small message's round trip on loopback; 0 never spins.
    std::chrono::microseconds spin{50};
    /// The largest message this rank accepts before its receive is posted (it must then be held
    /// whole in memory; CHORUS_MAX_MESSAGE_BYTES); a larger one fails the group, naming its
    /// sender, before anything is allocated. 0: half of the host's physical memory. Messages
    /// whose receive is posted go straight into its buffer and are not limited.
    std::size_t max_message_bytes = 0;
    /// Flow control (CHORUS_MAX_UNEXPECTED_BYTES): the most bytes this rank holds for receives
    /// not yet posted, from all peers together. A message that would pass it is not read until
    /// its receive is posted: its sender's send waits, and so does what that sender sends after
    /// it (as MPI's rendezvous protocol makes large sends wait for their receive: a program
    /// that needs a later message of a peer before it posts the receive of an earlier, larger
    /// one deadlocks, and times out naming the held message).
    std::size_t max_unexpected_bytes = std::size_t{256} << 20;
    /// The congestion control of the mesh's connections (CHORUS_TCP_CONGESTION). Empty (the
    /// default): Reno between ranks of one host, whose loopback needs no probing and which a
    /// pacing algorithm such as BBR slows down 2-5x on large messages, and the system's default
    /// (net.ipv4.tcp_congestion_control) between hosts. "system": the system's default
    /// everywhere. A name ("cubic", "bbr", "dctcp"): that one everywhere; where the kernel does
    /// not allow it, every rank throws invalid_argument saying so, before the rendezvous.
    std::string congestion;
    /// Where to report whom this rank blames when its group fails (CHORUS_BLAME_FD, a pipe
    /// chorusrun reads to name the root cause): one line "chorus-blame RANK BLAMED". -1: none.
    int blame_fd = -1;
    /// Must be equal on all ranks of a job; connections with another token are refused, and told
    /// so. From CHORUS_JOB_TOKEN, else the launcher's job identity (Slurm's job and step, torchrun's
    /// run id, Open MPI's namespace): two jobs that meet on one port never join each other.
    std::string job_token;
    /// Called by rank 0 once its master socket is listening, with the bound port. With
    /// master_port 0 the system picks a free port: tests pass it to the other ranks this way.
    std::function<void(std::uint16_t)> on_master_listening;
};

/// The configuration a launcher describes in the environment (detail::read_launch_env: RANK,
/// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT or their Slurm and Open MPI counterparts;
/// "[::1]" is accepted as MASTER_ADDR), and chorus's own CHORUS_JOB_TOKEN, CHORUS_TIMEOUT_MS,
/// CHORUS_HEARTBEAT_MS, CHORUS_SPIN_US, CHORUS_MAX_MESSAGE_BYTES, CHORUS_MAX_UNEXPECTED_BYTES,
/// CHORUS_SOCKET_IFNAME, CHORUS_TCP_CONGESTION, CHORUS_NT_COPY_BYTES (host_memory::copy),
/// CHORUS_PORT_RANGE ("lo-hi"), CHORUS_BLAME_FD and, for rank 0, CHORUS_MASTER_FD (both set by
/// chorusrun). Errors name `caller` and the variable.
inline tcp_config tcp_config_from_env(char const* caller = "tcp_transport::from_env") {
    detail::env_reader const env(caller);
    detail::launch_env const l = detail::read_launch_env(env);
    tcp_config c;
    c.rank = l.rank;
    c.size = l.size;
    c.local_rank = l.local_rank;
    c.master_addr = l.master_addr;
    c.master_port = l.master_port;
    c.job_token = env.get({"CHORUS_JOB_TOKEN"});
    if (c.job_token.empty()) c.job_token = l.identity;  // two jobs never join each other
    c.timeout = std::chrono::milliseconds(env.number_at_least("CHORUS_TIMEOUT_MS", 0, c.timeout.count()));
    c.heartbeat = std::chrono::milliseconds(env.number_at_least("CHORUS_HEARTBEAT_MS", 0, c.heartbeat.count()));
    c.spin = std::chrono::microseconds(env.number_at_least("CHORUS_SPIN_US", 0, c.spin.count()));
    c.max_message_bytes = static_cast<std::size_t>(env.number_at_least("CHORUS_MAX_MESSAGE_BYTES", 1, 0));
    c.max_unexpected_bytes = static_cast<std::size_t>(
        env.number_at_least("CHORUS_MAX_UNEXPECTED_BYTES", 0, static_cast<long long>(c.max_unexpected_bytes)));
    c.socket_ifname = env.get({"CHORUS_SOCKET_IFNAME"});
    c.congestion = env.get({"CHORUS_TCP_CONGESTION"});
    if (std::string r = env.get({"CHORUS_PORT_RANGE"}); !r.empty()) {
        std::size_t const dash = r.find_first_of("-:");
        if (dash == std::string::npos) env.fail("CHORUS_PORT_RANGE must be LOW-HIGH: '" + r + "'");
        c.port_min = env.port(r.substr(0, dash), "CHORUS_PORT_RANGE");
        c.port_max = env.port(r.substr(dash + 1), "CHORUS_PORT_RANGE");
        if (c.port_min > c.port_max) env.fail("CHORUS_PORT_RANGE is empty: '" + r + "'");
    }
    if (std::string fd = env.get({"CHORUS_BLAME_FD"}); !fd.empty())
        c.blame_fd = static_cast<int>(env.number(fd, "CHORUS_BLAME_FD"));
    if (std::string fd = env.get({"CHORUS_MASTER_FD"}); !fd.empty() && c.rank == 0)
        c.master_fd = static_cast<int>(env.number(fd, "CHORUS_MASTER_FD"));
    detail::nt_copy_bytes_from(env);  // read by host_memory::copy, process-wide; checked here, naming the caller
    return c;
}

/// What a TCP transport did since it was made (tcp_transport::stats()): to see where a
/// collective's time goes without a profiler. Counted by the thread that drives the transport
/// (the heartbeat thread's frames are not counted); subtract two snapshots for one call.
struct tcp_stats {
    std::uint64_t bytes_sent = 0;      ///< frame bytes handed to the kernel (headers included)
    std::uint64_t bytes_received = 0;  ///< frame bytes taken from the kernel
    std::uint64_t send_calls = 0;      ///< sendmsg calls
    std::uint64_t send_full = 0;       ///< of those, the ones that found the socket's buffer full before all was written
    std::uint64_t recv_calls = 0;      ///< recv calls
    std::uint64_t recv_empty = 0;      ///< of those, the ones that found nothing to read yet
    std::uint64_t bytes_direct = 0;    ///< payload received straight into a posted receive's buffer
    std::uint64_t bytes_staged = 0;    ///< payload copied into a receive's buffer from the 64 KiB staging buffer
    std::uint64_t bytes_unexpected = 0;  ///< payload from peers that arrived before its receive was posted (held, copied later)
    std::uint64_t polls = 0;           ///< ppoll rounds
    std::uint64_t sleeps = 0;          ///< of those, the ones allowed to block
    std::uint64_t slept_ns = 0;        ///< time spent blocked in them
    std::uint64_t yields = 0;          ///< sched_yield calls while spinning
};

namespace detail {

/// The bound of the rendezvous and of the goodbye at shutdown: the timeout, or 30 s where
/// waits are unbounded (a rank that never starts must still be reported).
inline std::chrono::milliseconds setup_timeout(tcp_config const& c) noexcept {
    return c.timeout.count() > 0 ? c.timeout : std::chrono::milliseconds(30000);
}

} // namespace detail

} // namespace chorus
