// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Addresses and sockets, for the rendezvous: bracketed IPv6 literals, an interface's address
// (CHORUS_SOCKET_IFNAME), socket options, a rank's listening socket (CHORUS_PORT_RANGE), and a
// launcher's listening socket (CHORUS_MASTER_FD).

#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <vector>

#include <asio/buffer.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <cerrno>
#include <ifaddrs.h>     // getifaddrs: CHORUS_SOCKET_IFNAME
#include <netinet/in.h>
#include <netinet/tcp.h>  // TCP_CONGESTION
#include <sys/socket.h>  // getsockname/getsockopt: a launcher's master socket
#include <unistd.h>      // close

#include <chorus/error.hpp>
#include <chorus/transport/tcp/config.hpp>

namespace chorus::detail {

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
    for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
        if (!i->ifa_addr || name != i->ifa_name) continue;
        if (!v6 && i->ifa_addr->sa_family == AF_INET) {
            asio::ip::address_v4::bytes_type b;
            std::memcpy(b.data(), &reinterpret_cast<sockaddr_in const*>(i->ifa_addr)->sin_addr, 4);
            found = asio::ip::address_v4(b).to_string();
        } else if (v6 && i->ifa_addr->sa_family == AF_INET6) {
            asio::ip::address_v6::bytes_type b;
            std::memcpy(b.data(), &reinterpret_cast<sockaddr_in6 const*>(i->ifa_addr)->sin6_addr, 16);
            asio::ip::address_v6 const a(b);
            if (!a.is_link_local()) found = a.to_string();
            else if (link_local.empty()) link_local = a.to_string() + "%" + name;
        }
    }
    ::freeifaddrs(list);
    return found.empty() ? link_local : found;
}

inline std::string congestion_refused(std::string const& name, int error);

/// Whether a connected socket's peer is on this host (loopback, or one of our own addresses):
/// no network in between.
inline bool same_host(asio::ip::tcp::socket const& s) {
    asio::error_code ec;
    auto const here = s.local_endpoint(ec).address();
    if (ec) return false;
    auto const there = s.remote_endpoint(ec).address();
    return !ec && (there.is_loopback() || there == here);
}

/// Sets up a mesh connection: no Nagle, 4 MiB buffers, and the congestion control that
/// tcp_config::congestion asks for. Inside one host that is Reno by default: the kernel's
/// loopback delivers a segment as it is sent, so there is no network to probe, and a pacing
/// algorithm (BBR, the default of some distributions and clouds) holds the data of a bursty
/// collective back: a 64 MiB broadcast between two ranks took 53 ms under BBR, 10 under Reno
/// (docs/algorithms.md). Returns why the requested algorithm could not be set, or nothing.
inline std::string tune_socket(asio::ip::tcp::socket& s, std::string const& congestion) {
    asio::error_code ec;
    s.set_option(asio::ip::tcp::no_delay(true), ec);
    s.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
    s.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
    if (congestion == "system") return {};
    bool const chosen = !congestion.empty();
    if (!chosen && !same_host(s)) return {};
    std::string const name = chosen ? congestion : "reno";
    if (::setsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0 ||
        !chosen)
        return {};
    return congestion_refused(name, errno);
}

inline std::string congestion_refused(std::string const& name, int error) {
    return "CHORUS_TCP_CONGESTION=" + name + " cannot be set (" + std::strerror(error) +
           "; see net.ipv4.tcp_available_congestion_control and tcp_allowed_congestion_control)";
}

/// Whether this process may set congestion control `name` on its TCP sockets: why not, or
/// nothing. Every rank asks before the rendezvous, so that all of them refuse a name at once
/// (a rank that only accepts connections would otherwise wait for peers that gave up).
inline std::string check_congestion(std::string const& name) {
    if (name.empty() || name == "system") return {};
    int const fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return {};  // no socket to try on: the connections will say
    int const refused = ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0 ? 0 : errno;
    ::close(fd);
    return refused ? congestion_refused(name, refused) : std::string();
}

/// Callbacks after a delay on one io_context, all cancelled at once by cancel_all() (then none
/// runs any more); a timer goes once it fired. The rendezvous's retries, the gate's deadlines.
class tcp_timers {
public:
    explicit tcp_timers(asio::io_context& io) : io_(io) {}

    template <class F>
    void after(std::chrono::milliseconds wait, F f) {
        auto const t = timers_.emplace(timers_.end(), io_, wait);
        t->async_wait([this, t, f = std::move(f)](asio::error_code e) {
            if (!cancelled_ && !e) f();
            timers_.erase(t);
        });
    }

    void cancel_all() noexcept {
        cancelled_ = true;
        for (auto& t : timers_) t.cancel();
    }

private:
    asio::io_context& io_;
    std::list<asio::steady_timer> timers_;
    bool cancelled_ = false;
};

/// Writes what the socket's buffer takes now, never blocking: best effort, for a message a
/// peer may read before the connection closes (a refusal is far smaller than a fresh
/// connection's buffer; a peer that does not read gets less).
inline void tell(asio::ip::tcp::socket& sock, std::vector<unsigned char> const& message) noexcept {
    asio::error_code ignore;
    if (!sock.is_open()) return;
    sock.non_blocking(true, ignore);
    sock.write_some(asio::buffer(message), ignore);
}

/// Opens `listener` on any free port, or on the first free one of cfg's port range (starting at
/// an offset by rank, so that the ranks of one host do not all race for the same port), and
/// returns the port.
inline std::uint16_t bind_listener(asio::ip::tcp::acceptor& listener, asio::ip::tcp family, tcp_config const& cfg) {
    std::string const me = "rank " + std::to_string(cfg.rank);
    asio::error_code ec;
    listener.open(family, ec);
    if (ec) throw transport_error(errc::connection_failed, cfg.rank, me + ": cannot open a listening socket: " + ec.message());
    if (cfg.port_max == 0) {
        listener.bind(asio::ip::tcp::endpoint(family, 0), ec);
    } else {
        unsigned const span = unsigned{cfg.port_max} - cfg.port_min + 1;
        for (unsigned i = 0; i < span; ++i) {
            auto const port = static_cast<std::uint16_t>(cfg.port_min + (static_cast<unsigned>(cfg.rank) + i) % span);
            listener.bind(asio::ip::tcp::endpoint(family, port), ec);
            if (!ec) break;
        }
    }
    if (!ec) listener.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        throw transport_error(errc::connection_failed, cfg.rank,
                              me + ": cannot listen on " +
                                  (cfg.port_max == 0 ? std::string("an ephemeral port")
                                                     : "any port of " + std::to_string(cfg.port_min) + "-" +
                                                           std::to_string(cfg.port_max)) +
                                  ": " + ec.message());
    return listener.local_endpoint().port();
}

/// Makes `master` the launcher's already listening socket `fd` (tcp_config::master_fd), or
/// closes `fd` and throws if it is not one.
inline void adopt_listening_socket(asio::ip::tcp::acceptor& master, int fd) {
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

} // namespace chorus::detail
