// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// tcp_transport's implementation (see <chorus/transport/tcp.hpp>): the rendezvous
// (tcp/rendezvous.hpp) and the engine (tcp/engine.hpp), joined by connect_tcp. Included by
// tcp.hpp unless CHORUS_TCP_SEPARATE_COMPILATION is defined; then include it in exactly one
// .cpp file of the program (with the macro defined there too), which compiles them once.

#include <memory>
#include <string>
#include <utility>

#include <unistd.h>  // close

#include <chorus/error.hpp>
#include <chorus/transport/tcp.hpp>
#include <chorus/transport/tcp/config.hpp>
#include <chorus/transport/tcp/engine.hpp>
#include <chorus/transport/tcp/net.hpp>
#include <chorus/transport/tcp/rendezvous.hpp>
#include <chorus/transport/tcp/wire.hpp>

namespace chorus::detail {

/// Rejects what no rendezvous could work with; normalises addresses; closes a master socket
/// handed to a rank that does not run the rendezvous's master side.
inline void validate(tcp_config& cfg) {
    if (cfg.size < 1) throw invalid_argument("tcp_transport: size must be at least 1, got " + std::to_string(cfg.size));
    if (cfg.rank < 0 || cfg.rank >= cfg.size)
        throw invalid_argument("tcp_transport: rank " + std::to_string(cfg.rank) + " is out of range for " +
                               std::to_string(cfg.size) + " ranks");
    if (cfg.job_token.size() > tcp_wire::max_token) throw invalid_argument("tcp_transport: job token too long");
    if (cfg.port_min > cfg.port_max)
        throw invalid_argument("tcp_transport: port range " + std::to_string(cfg.port_min) + "-" +
                               std::to_string(cfg.port_max) + " is empty");
    if ((cfg.size == 1 || cfg.rank != 0) && cfg.master_fd >= 0) ::close(std::exchange(cfg.master_fd, -1));
    if (std::string const why = check_congestion(cfg.congestion); !why.empty())
        throw invalid_argument("tcp_transport: rank " + std::to_string(cfg.rank) + ": " + why);
    cfg.master_addr = strip_brackets(cfg.master_addr);
    cfg.advertise_addr = strip_brackets(cfg.advertise_addr);
}

CHORUS_TCP_DECL std::unique_ptr<tcp_engine> connect_tcp(tcp_config config) {
    validate(config);
    tcp_mesh mesh;
    try {
        if (config.size > 1) mesh = tcp_rendezvous(config).run();
        else mesh.sockets.resize(1);
    } catch (transport_error const& e) {  // a rank that never joined, or refused us
        report_blame(config.blame_fd, config.rank, e.peer());
        throw;
    }
    return std::make_unique<tcp_socket_engine>(config, std::move(mesh.io), std::move(mesh.sockets));
}

} // namespace chorus::detail
