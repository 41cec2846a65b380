// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// How the ranks of a TCP group find each other and form a full mesh, in five steps:
//
// 1. listen: every rank opens its own listening socket (an ephemeral port, or the first free
//    one of port_min..port_max); rank 0 also listens on master_addr:master_port, or adopts
//    the listening socket a launcher bound for it (master_fd), so the port cannot be taken in
//    between.
// 2. hello: every rank, rank 0 included, connects to the master (retrying with back-off: it
//    may not be up yet) and sends {token, rank, size, port, address} (wire.hpp), the address
//    being advertise_addr, the address of interface socket_ifname, or by default the local end
//    of its master connection (the address the master can reach it on).
// 3. table: once every rank said hello, the master sends everyone the table of (address,
//    port).
// 4. mesh: each rank connects to every lower rank and accepts from every higher one: every
//    pair gets one connection, and as listening sockets exist before anyone connects, nobody
//    waits for a connection that is not being accepted (no deadlock).
//    A connection counts once the acceptor answered `accepted`; one turned away before (its
//    handshake held up past the gate's grace by packet loss, a flood over the gate's cap) is
//    made again, and so is a connection attempt unanswered for 2 s. Once a rank holds all its
//    connections it says `ready` on each.
// 5. verify: the steps run until every peer said ready (so no rank starts its collectives, or
//    its heartbeat watch, while another still connects), a step failed, or the deadline
//    passed; then whatever is still pending is closed, and a failure says which ranks are
//    missing. A peer that closes a held connection fails the rendezvous at once, naming it.
//
// A connection whose handshake is wrong (token, rank, garbage) is closed and logged on stderr:
// a port scanner or another job's stray rank must not break this job. Everything is async on
// one io_context, run by the calling thread until the deadline, so one timeout bounds it all.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <asio/buffer.hpp>
#include <asio/connect.hpp>
#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/tcp/config.hpp>
#include <chorus/transport/tcp/gate.hpp>
#include <chorus/transport/tcp/net.hpp>
#include <chorus/transport/tcp/wire.hpp>

namespace chorus::detail {

/// What the rendezvous leaves: the connection to every other rank, and their io_context.
struct tcp_mesh {
    std::unique_ptr<asio::io_context> io;
    std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets;  // by rank; null for this one
};

class tcp_rendezvous {
public:
    /// `cfg` is validated (tcp_impl.hpp); rank 0 writes the port it bound into it.
    explicit tcp_rendezvous(tcp_config& cfg)
        : cfg_(cfg), me_(cfg.rank), n_(static_cast<std::size_t>(cfg.size)), io_(std::make_unique<asio::io_context>()),
          timers_(*io_), listener_(*io_), to_master_(*io_), joined_(n_), sockets_(n_), endpoints_(n_),
          gate_(*io_, cfg.rank, std::min(setup_timeout(cfg), std::chrono::milliseconds(5000))), held_by_(n_),
          ready_in_(n_), refused_by_(n_) {}

    tcp_mesh run() {
        deadline_ = std::chrono::steady_clock::now() + setup_timeout(cfg_);
        listen();
        connect_master();
        while (!complete() && fatal_.empty())
            if (io_->run_one_until(deadline_) == 0) break;
        // A rank waiting for the table gives the master a moment for its verdict: at the same
        // deadline the master knows which rank never joined, and says so to every rank that did.
        auto const verdict = deadline_ + std::min(setup_timeout(cfg_), milliseconds(1000));
        while (me_ != 0 && awaiting_table_ && !have_table_ && fatal_.empty())
            if (io_->run_one_until(verdict) == 0) break;
        bool const ok = complete() && fatal_.empty();
        std::optional<failure> failed;
        if (!ok) failed = why_failed();
        if (failed && me_ == 0) tell_joined(*failed);  // rather than leave them to time out
        drain(ok);
        if (failed) raise(*failed);
        return {std::move(io_), std::move(sockets_)};
    }

private:
    using tcp = asio::ip::tcp;
    using milliseconds = std::chrono::milliseconds;

    struct joiner : tcp_incoming {  // a rank's hello, at the master
        using tcp_incoming::tcp_incoming;
        std::array<unsigned char, tcp_wire::hello_head_size> head{};
        tcp_wire::hello_head hello{};
        std::vector<unsigned char> rest;  // mac, address
        std::string addr;
    };
    struct mesh_in : tcp_incoming {  // a higher rank's mesh handshake
        using tcp_incoming::tcp_incoming;
        std::array<unsigned char, tcp_wire::mesh_head_size> head{};
        std::uint64_t rank = 0;
    };

    std::string me() const { return "rank " + std::to_string(me_); }

    // ---- 1. listen ---------------------------------------------------------------------------

    void listen() {
        resolve_master();
        if (advertised_.empty() && !cfg_.socket_ifname.empty()) {
            advertised_ = interface_address(cfg_.socket_ifname, family_ == tcp::v6());
            if (advertised_.empty())
                throw transport_error(errc::connection_failed, me_,
                                      me() + ": interface '" + cfg_.socket_ifname + "' (CHORUS_SOCKET_IFNAME) has no " +
                                          (family_ == tcp::v6() ? "IPv6" : "IPv4") + " address");
        }
        my_port_ = bind_listener(listener_, family_, cfg_);
        accept_mesh();
        if (me_ != 0) return;
        open_master();
        accept_hello();
    }

    void resolve_master() {
        advertised_ = cfg_.advertise_addr;
        where_ = cfg_.master_addr + ":" + std::to_string(cfg_.master_port);
        asio::error_code ec;
        master_ip_ = asio::ip::make_address(cfg_.master_addr, ec);
        if (ec) {
            tcp::resolver resolver(*io_);
            auto results = resolver.resolve(cfg_.master_addr, std::to_string(cfg_.master_port), ec);
            if (ec || results.empty())
                throw transport_error(errc::connection_failed, 0,
                                      me() + ": cannot resolve master address " + cfg_.master_addr + ": " + ec.message());
            master_ip_ = results.begin()->endpoint().address();
        }
        family_ = master_ip_.is_v6() ? tcp::v6() : tcp::v4();
    }


    // Rank 0's master socket: the launcher's (master_fd), or bound here. Reports the port.
    void open_master() {
        master_.emplace(*io_);
        if (cfg_.master_fd >= 0) {
            adopt_listening_socket(*master_, std::exchange(cfg_.master_fd, -1));
        } else {
            tcp::endpoint const ep(master_ip_, cfg_.master_port);
            asio::error_code ec;
            master_->open(ep.protocol(), ec);
            if (!ec) master_->set_option(tcp::acceptor::reuse_address(true), ec);
            if (!ec) master_->bind(ep, ec);
            if (!ec) master_->listen(asio::socket_base::max_listen_connections, ec);
            if (ec == asio::error::address_in_use)
                throw transport_error(errc::connection_failed, 0,
                                      "rank 0: cannot listen on " + where_ + ": the port is in use — another job's "
                                      "rendezvous holds it (give each job its own MASTER_PORT; under Slurm every "
                                      "step derives its own from SLURM_JOB_ID and SLURM_STEP_ID)");
            if (ec) throw transport_error(errc::connection_failed, 0, "rank 0: cannot listen on " + where_ + ": " + ec.message());
        }
        cfg_.master_port = master_->local_endpoint().port();  // the system's pick for port 0
        where_ = cfg_.master_addr + ":" + std::to_string(cfg_.master_port);
        if (cfg_.on_master_listening) cfg_.on_master_listening(cfg_.master_port);
    }

    // ---- 2. hello: every rank to the master ----------------------------------------------------

    void connect_master() {
        auto const answered = abandon_unless_answered(to_master_);
        to_master_.async_connect(tcp::endpoint(master_ip_, cfg_.master_port), [this, answered](asio::error_code e) {
            if (finished_) return;
            *answered = true;
            if (!e && to_master_.is_open()) return read_master_challenge();
            // It listened before and no longer does: its process ended (a refusal would have
            // said why); waiting for the deadline would only hide that.
            if (e == asio::error::connection_refused && master_seen_)
                return fail(errc::connection_failed, 0,
                            me() + ": the master (rank 0) at " + where_ + " stopped listening during the rendezvous: it exited");
            connect_master_later();
        });
    }

    // Closes the attempt and tries again after a back-off (5 ms, doubling up to 200 ms): the
    // master may not listen yet.
    void connect_master_later() {
        asio::error_code ignore;
        to_master_.close(ignore);
        timers_.after(std::exchange(backoff_, std::min(backoff_ * 2, milliseconds(200))), [this] { connect_master(); });
    }

    // The master closed this rank's connection before its challenge or its table: connect and
    // say hello again.
    void turned_away_by_master() {
        ++turned_away_;
        awaiting_table_ = false;
        connect_master_later();
    }

    // The master's challenge first: the hello answers it (wire.hpp). A connection closed before
    // any challenge was turned away by the master's gate (gate.hpp: a burst of silent
    // connections fills its cap, and the newest goes while none has been silent for long):
    // connect again, as when the master was not listening yet. The gate then closes the oldest
    // of the silent ones instead, so the rank gets in; the rendezvous's deadline still bounds it.
    void read_master_challenge() {
        asio::async_read(to_master_, asio::buffer(challenge_in_), [this](asio::error_code e, std::size_t got) {
            if (finished_) return;
            if (got == 0 && (e == asio::error::eof || e == asio::error::connection_reset)) return turned_away_by_master();
            if (e) return void(fatal_ = me() + ": no challenge from the master at " + where_ + ": " + e.message());
            auto const nonce = tcp_wire::decode_challenge(challenge_in_.data());
            if (!nonce) return void(fatal_ = me() + ": " + where_ + " is not a chorus master of this version (no challenge)");
            master_seen_ = true;
            send_hello(*nonce);
        });
    }

    void send_hello(tcp_wire::nonce const& nonce) {
        asio::error_code le;
        std::string const addr = advertised_.empty() ? to_master_.local_endpoint(le).address().to_string() : advertised_;
        hello_ = tcp_wire::encode_hello(me_, cfg_.size, my_port_, cfg_.job_token, addr, nonce);
        asio::async_write(to_master_, asio::buffer(hello_), [this](asio::error_code e, std::size_t) {
            if (finished_) return;
            if (e == asio::error::connection_reset || e == asio::error::broken_pipe) return turned_away_by_master();
            if (e) return void(fatal_ = me() + ": hello to the master failed: " + e.message());
            awaiting_table_ = true;
            read_table();
        });
    }

    // ---- 3. table: the master to every rank ----------------------------------------------------

    void read_table() {
        asio::async_read(to_master_, asio::buffer(table_len_), [this](asio::error_code e, std::size_t got) {
            if (finished_) return;
            // The master's gate closed the connection before the hello arrived (held up by packet
            // loss past its grace): say hello again.
            if (got == 0 && (e == asio::error::eof || e == asio::error::connection_reset)) return turned_away_by_master();
            auto const len = tcp_wire::get64(table_len_.data());
            if (!e && len == tcp_wire::refusal) return read_refusal();
            if (e || len > tcp_wire::max_table)
                return void(fatal_ = me() + ": no rendezvous table from the master at " + where_ + ": " +
                                     (e ? e.message() : std::string("bad length")));
            table_in_.resize(static_cast<std::size_t>(len));
            asio::async_read(to_master_, asio::buffer(table_in_), [this](asio::error_code e2, std::size_t) {
                if (finished_) return;
                if (e2) return void(fatal_ = me() + ": rendezvous table from the master at " + where_ + " cut short: " + e2.message());
                on_table();
            });
        });
    }

    // The master will send no table: why (its rendezvous failed, or it refused this rank).
    void read_refusal() {
        asio::async_read(to_master_, asio::buffer(refusal_head_), [this](asio::error_code e, std::size_t) {
            if (finished_) return;
            if (e) return void(fatal_ = me() + ": the master at " + where_ + " refused this rank (its reason cut short)");
            auto const len = std::min<std::uint64_t>(tcp_wire::get64(refusal_head_.data() + 16), tcp_wire::max_refusal_text);
            refusal_text_.resize(static_cast<std::size_t>(len));
            asio::async_read(to_master_, asio::buffer(refusal_text_), [this](asio::error_code e2, std::size_t) {
                if (finished_) return;
                auto const code = tcp_wire::get64(refusal_head_.data());
                auto const blame = static_cast<std::int64_t>(tcp_wire::get64(refusal_head_.data() + 8));
                bool const known = code >= static_cast<std::uint64_t>(errc::invalid_argument) &&
                                   code <= static_cast<std::uint64_t>(errc::device_error);
                refused_code_ = known ? static_cast<errc>(code) : errc::connection_failed;
                refused_blame_ = blame >= -1 && blame < static_cast<std::int64_t>(n_) ? static_cast<rank_t>(blame) : -1;
                std::string const why(refusal_text_.begin(), refusal_text_.end());
                fatal_ = me() + ": the rendezvous failed at the master (rank 0) at " + where_ + ": " +
                         (e2 ? std::string("(its reason cut short)") : printable(why));
            });
        });
    }

    void on_table() {
        auto const entries = tcp_wire::decode_table(table_in_, n_);
        if (!entries) return void(fatal_ = me() + ": bad rendezvous table");
        for (std::size_t q = 0; q < n_; ++q) {
            asio::error_code e;
            auto const ip = asio::ip::make_address((*entries)[q].addr, e);
            if (e) return void(fatal_ = me() + ": bad address in rendezvous table: " + (*entries)[q].addr);
            endpoints_[q] = tcp::endpoint(ip, (*entries)[q].port);
        }
        have_table_ = true;
        asio::error_code ignore;
        to_master_.close(ignore);
        for (rank_t q = 0; q < me_; ++q) connect_peer(q, milliseconds(5));
    }

    // Rank 0: accepts hellos until every rank joined, then sends every rank the table.
    void accept_hello() { accept_loop<joiner>(*master_, &tcp_rendezvous::on_hello_head); }

    void on_hello_head(std::shared_ptr<joiner> const& j, asio::error_code e, std::size_t got) {
        if (j->settled) return;  // refused meanwhile (a read that had completed still reports)
        auto const& h = j->hello = tcp_wire::decode_hello(j->head.data());
        if (e) return gate_.refuse(*j, got ? "not a chorus handshake (" + std::to_string(got) + " bytes, then closed)" : "closed before its handshake");
        if (h.magic != tcp_wire::hello_magic) return gate_.refuse(*j, "not a chorus handshake");
        if (h.addr_len > tcp_wire::max_addr) return gate_.refuse(*j, "malformed handshake");
        j->rest.resize(tcp_wire::mac_size + static_cast<std::size_t>(h.addr_len));
        asio::async_read(j->sock, asio::buffer(j->rest), [this, j](asio::error_code e2, std::size_t) {
            if (!finished_) on_hello_rest(j, e2);
        });
    }

    void on_hello_rest(std::shared_ptr<joiner> const& j, asio::error_code e) {
        if (j->settled) return;
        auto const mac_end = j->rest.begin() + static_cast<std::ptrdiff_t>(tcp_wire::mac_size);
        if (e) return gate_.refuse(*j, "closed during its handshake");
        std::string const addr(mac_end, j->rest.end());
        auto const expected = tcp_wire::hello_mac(cfg_.job_token, j->challenge.value, j->head, addr);
        if (!equal_in_constant_time(expected, {j->rest.data(), tcp_wire::mac_size})) return refuse_rank(*j, "wrong job token");
        auto const& h = j->hello;
        if (h.size != n_)
            return refuse_rank(*j, "it belongs to a job of " + std::to_string(h.size) + " ranks, this one has " + std::to_string(n_));
        if (h.rank >= n_ || h.port == 0 || h.port > 65535) return gate_.refuse(*j, "malformed handshake");
        auto& slot = joined_[static_cast<std::size_t>(j->hello.rank)];
        if (slot) return refuse_rank(*j, "rank " + std::to_string(j->hello.rank) + " has already joined");
        j->addr = addr;
        j->settled = true;
        slot = j;
        if (++joined_count_ == n_) send_tables();
    }

    void send_tables() {
        std::vector<tcp_wire::table_entry> entries;
        for (auto const& j : joined_) entries.push_back({j->addr, static_cast<std::uint16_t>(j->hello.port)});
        table_ = tcp_wire::encode_table(entries);
        for (auto const& j : joined_)
            asio::async_write(j->sock, asio::buffer(table_), [this](asio::error_code e, std::size_t) {
                if (finished_) return;
                if (e) fatal_ = "rank 0: could not send the rendezvous table: " + e.message();
                ++tables_sent_;
            });
    }

    // ---- 4. mesh: connect to lower ranks, accept higher ones ------------------------------------
    //
    // A connection is held once both ends know it is a rank of this job: the acceptor checks
    // the handshake and answers one byte (accepted), and the connector holds it when that byte
    // arrives. Until then the acceptor's gate may still close it (a handshake held up by packet
    // loss past the gate's grace, a flood over its cap), and the connector connects again:
    // being turned away costs a retry, never the job; the deadline bounds the retries and
    // names the rank. Once a rank holds all its connections it sends one more byte (ready) on
    // each, and leaves only when every peer's ready arrived: a rank does not start its
    // collectives, nor the heartbeat watch over its peers, while one of them is still
    // connecting (it would be silent for as long, and be blamed for it).

    void connect_peer(rank_t q, milliseconds wait) {
        auto sock = std::make_shared<tcp::socket>(*io_);
        connecting_.push_back(sock);
        auto again = [this, sock, q, wait] {
            asio::error_code ignore;
            sock->close(ignore);
            timers_.after(wait, [this, q, wait] { connect_peer(q, std::min(wait * 2, milliseconds(200))); });
        };
        auto const answered = abandon_unless_answered(*sock);
        sock->async_connect(endpoints_[static_cast<std::size_t>(q)], [this, sock, q, again, answered](asio::error_code e) {
            if (finished_) return;
            *answered = true;
            if (e || !sock->is_open()) return again();
            if (auto const why = tune_socket(*sock, cfg_.congestion); !why.empty()) return void(fatal_ = me() + ": " + why);
            auto hs = std::make_shared<std::vector<unsigned char>>(tcp_wire::challenge_size);
            asio::async_read(*sock, asio::buffer(*hs), [this, sock, hs, q, again](asio::error_code e2, std::size_t) {
                if (finished_) return;
                if (e2) return turned_away(q, again);
                auto const nonce = tcp_wire::decode_challenge(hs->data());
                if (!nonce) return void(fatal_ = me() + ": handshake with rank " + std::to_string(q) + " failed: no challenge");
                *hs = tcp_wire::encode_mesh(me_, cfg_.job_token, *nonce);
                asio::async_write(*sock, asio::buffer(*hs), [this, sock, hs, q, again](asio::error_code e3, std::size_t) {
                    if (finished_) return;
                    if (e3) return turned_away(q, again);
                    hs->resize(1);
                    asio::async_read(*sock, asio::buffer(*hs), [this, sock, hs, q, again](asio::error_code e4, std::size_t) {
                        if (finished_) return;
                        if (e4) return turned_away(q, again);
                        if ((*hs)[0] != tcp_wire::mesh_accepted)
                            return void(fatal_ = me() + ": handshake with rank " + std::to_string(q) + " failed: not accepted");
                        sockets_[static_cast<std::size_t>(q)] = std::make_unique<tcp::socket>(std::move(*sock));
                        hold(q);
                    });
                });
            });
        });
    }

    // Rank q closed this rank's connection before accepting it: connect again.
    template <class Again>
    void turned_away(rank_t q, Again const& again) {
        ++refused_by_[static_cast<std::size_t>(q)];
        again();
    }

    void accept_mesh() { accept_loop<mesh_in>(listener_, &tcp_rendezvous::on_mesh_head); }

    void on_mesh_head(std::shared_ptr<mesh_in> const& m, asio::error_code e, std::size_t got) {
        if (m->settled) return;
        auto const h = tcp_wire::decode_mesh(m->head.data());
        m->rank = h.rank;
        if (e) return gate_.refuse(*m, got ? "not a chorus handshake (" + std::to_string(got) + " bytes, then closed)" : "closed before its handshake");
        if (h.magic != tcp_wire::mesh_magic) return gate_.refuse(*m, "not a chorus handshake");
        auto const expected = tcp_wire::mesh_mac(cfg_.job_token, m->challenge.value, {m->head.data(), 16});
        if (!equal_in_constant_time(expected, h.proof)) return gate_.refuse(*m, "wrong job token");
        if (h.rank <= static_cast<std::uint64_t>(me_) || h.rank >= n_) return gate_.refuse(*m, "unexpected rank " + std::to_string(h.rank));
        auto const q = static_cast<std::size_t>(m->rank);
        if (sockets_[q]) return gate_.refuse(*m, "rank " + std::to_string(m->rank) + " is already connected");
        if (auto const why = tune_socket(m->sock, cfg_.congestion); !why.empty()) return void(fatal_ = me() + ": " + why);
        m->settled = true;
        sockets_[q] = std::make_unique<tcp::socket>(std::move(m->sock));
        // Held once the byte went out; if it cannot (the connector is gone), the slot is freed
        // for its next attempt.
        asio::async_write(*sockets_[q], asio::buffer(&tcp_wire::mesh_accepted, 1), [this, q](asio::error_code e2, std::size_t) {
            if (finished_) return;
            if (!e2) return hold(static_cast<rank_t>(q));
            asio::error_code ignore;
            sockets_[q]->close(ignore);
            sockets_[q].reset();
        });
    }

    // Both ends hold the connection to q: q's ready is awaited on it, and once every
    // connection is held, this rank's ready goes out on each. A held connection that closes
    // before q's ready means q's rendezvous failed or q exited: that fails this one at once.
    void hold(rank_t q) {
        auto const i = static_cast<std::size_t>(q);
        held_by_[i] = true;
        ++held_;
        asio::async_read(*sockets_[i], asio::buffer(&ready_in_[i], 1), [this, q, i](asio::error_code e, std::size_t) {
            if (finished_) return;
            if (!e && ready_in_[i] == tcp_wire::mesh_ready) return void(++readies_in_);
            if (!e && ready_in_[i] == tcp_wire::mesh_failed) return gave_up(q);
            fail(errc::peer_failed, q,
                 me() + ": rank " + std::to_string(q) + (e ? " closed its connection during the rendezvous (" + e.message() + "): it exited"
                                                           : " broke the mesh protocol (no ready)"));
        });
        if (held_ != n_ - 1) return;
        for (std::size_t p = 0; p < n_; ++p)
            if (sockets_[p])
                asio::async_write(*sockets_[p], asio::buffer(&tcp_wire::mesh_ready, 1), [this, p](asio::error_code e, std::size_t) {
                    if (finished_) return;
                    if (!e) return void(++readies_out_);
                    fail(errc::peer_failed, static_cast<rank_t>(p),
                         me() + ": rank " + std::to_string(p) + " closed its connection during the rendezvous (" + e.message() + ")");
                });
    }

    // q's rendezvous failed before the mesh was complete: mostly its deadline passed (it
    // started first) waiting for ranks that this one misses too, so those are named, as this
    // rank's own deadline would; q only where this rank misses nobody else.
    void gave_up(rank_t q) {
        auto const [first, missing] = missing_ranks([&](std::size_t p) {
            return p != static_cast<std::size_t>(me_) && p != static_cast<std::size_t>(q) && ready_in_[p] != tcp_wire::mesh_ready;
        });
        std::string const what = me() + ": the rendezvous failed at rank " + std::to_string(q) + " before the mesh was complete";
        if (first < 0) return fail(errc::peer_failed, q, what);
        fail(errc::timeout, first, what + "; ranks that have not completed theirs: " + missing);
    }

    void fail(errc code, rank_t blame, std::string what) {
        if (!fatal_.empty()) return;
        refused_code_ = code;
        refused_blame_ = blame;
        fatal_ = std::move(what);
    }

    // ---- 5. verify ---------------------------------------------------------------------------

    bool complete() const {
        return have_table_ && held_ == n_ - 1 && readies_in_ == n_ - 1 && readies_out_ == n_ - 1 && (me_ != 0 || tables_sent_ == n_);
    }

    // Closes everything still pending (and, on failure, the mesh too), then runs the handlers
    // that are left: each sees finished_ and starts nothing new.
    void drain(bool ok) {
        finished_ = true;
        asio::error_code ignore;
        listener_.close(ignore);
        if (master_) master_->close(ignore);
        to_master_.close(ignore);
        timers_.cancel_all();
        for (auto& s : connecting_) s->close(ignore);
        gate_.close_all();
        for (auto& j : joined_)
            if (j) j->sock.close(ignore);
        if (!ok)
            for (std::size_t q = 0; q < n_; ++q) {
                if (!sockets_[q]) continue;
                // Peers holding it learn that this rendezvous failed, not that this rank
                // exited. Only before any ready went out: a peer that had every ready may have
                // left its rendezvous, and would read the byte as a frame (it sees the close).
                if (held_by_[q] && held_ < n_ - 1) tell(*sockets_[q], {tcp_wire::mesh_failed});
                sockets_[q]->close(ignore);
            }
        io_->restart();
        io_->run();
    }

    // Why the rendezvous failed: a step's error, or which ranks were missing at the deadline.
    struct failure {
        errc code;
        rank_t blame;
        std::string what;
    };

    [[noreturn]] static void raise(failure const& f) {
        if (f.code == errc::timeout) throw timeout_error(f.blame, f.what);
        throw transport_error(f.code, f.blame, f.what);
    }

    // Why the rendezvous failed: a step's error (or the master's refusal), or which ranks were
    // missing at the deadline.
    failure why_failed() const {
        if (!fatal_.empty()) return {refused_code_, refused_blame_, fatal_};
        std::string const after = " after " + std::to_string(setup_timeout(cfg_).count()) + " ms";
        if (me_ == 0 && joined_count_ < n_) {
            auto const [first, missing] = missing_ranks([&](std::size_t q) { return !joined_[q]; });
            return {errc::timeout, first, "rank 0: rendezvous on " + where_ + " timed out" + after + "; ranks that never joined: " + missing};
        }
        if (!have_table_)
            return {errc::timeout, 0,
                    me() + ": rendezvous timed out" + after + " waiting for the table from the master (rank 0) at " + where_ +
                        (turned_away_ == 0 ? std::string()
                                           : "; it closed " + std::to_string(turned_away_) + " of this rank's connections before answering its hello")};
        std::string refusals;
        for (std::size_t q = 0; q < n_; ++q)
            if (refused_by_[q] > 0)
                refusals += "; rank " + std::to_string(q) + " closed " + std::to_string(refused_by_[q]) + " of this rank's connections before accepting one";
        if (held_ < n_ - 1) {
            auto const [first, missing] = missing_ranks([&](std::size_t q) { return q != static_cast<std::size_t>(me_) && !held_by_[q]; });
            return {errc::timeout, std::max(first, 0),
                    me() + ": connecting the mesh timed out" + after + "; no connection with ranks: " + missing + refusals};
        }
        auto const [first, missing] = missing_ranks([&](std::size_t q) { return q != static_cast<std::size_t>(me_) && ready_in_[q] != tcp_wire::mesh_ready; });
        return {errc::timeout, std::max(first, 0),
                me() + ": the mesh was not complete" + after + ": this rank holds all its connections, but these ranks still miss some of theirs: " + missing};
    }

    // The master failed: every rank that joined learns why at once (no reply is awaited).
    // Not once the tables are being sent: a refusal must not land inside a table.
    void tell_joined(failure const& f) {
        if (!table_.empty()) return;
        auto const message = tcp_wire::encode_refusal(static_cast<std::uint64_t>(f.code), f.blame, f.what);
        for (auto& j : joined_)
            if (j) tell(j->sock, message);
    }

    template <class Missing>
    std::pair<rank_t, std::string> missing_ranks(Missing const& is_missing) const {
        rank_t first = -1;
        std::string list;
        for (std::size_t q = 0; q < n_; ++q)
            if (is_missing(q)) {
                if (first < 0) first = static_cast<rank_t>(q);
                list += (list.empty() ? "" : ", ") + std::to_string(q);
            }
        return {first, list};
    }

    // ---- helpers -----------------------------------------------------------------------------

    // A connection attempt not answered within two seconds is closed (its handler then sees
    // an error and tries again): the kernel waits 1, 2, 4, 8, 16 s between the SYNs of one
    // attempt, so where packets are lost, a few lost SYNs or SYN-ACKs would make it outwait the
    // deadline, while a fresh attempt starts at 1 s again. Returns the flag its handler sets.
    // A socket has one attempt at a time (the next starts from its handler), so the flag
    // belongs to that attempt even where the socket is reused (to_master_).
    std::shared_ptr<bool> abandon_unless_answered(tcp::socket& sock) {
        auto answered = std::make_shared<bool>(false);
        timers_.after(milliseconds(2000), [&sock, answered] {
            asio::error_code ignore;
            if (!*answered) sock.close(ignore);
        });
        return answered;
    }

    // A hello from what claims to be a chorus rank (its magic was right) that this job refuses:
    // the rank is told why, so that its own error says it, then refused as any stranger.
    void refuse_rank(joiner& j, std::string const& why) {
        gate_.refuse(j, why, tcp_wire::encode_refusal(static_cast<std::uint64_t>(errc::connection_failed), -1,
                                                      "the master refused this rank: " + why));
    }

    // Accepts connections on `acceptor` until the rendezvous is over, each through the gate,
    // and hands each its handshake's fixed part, read into a new C, to `on_head`.
    template <class C>
    void accept_loop(tcp::acceptor& acceptor, void (tcp_rendezvous::*on_head)(std::shared_ptr<C> const&, asio::error_code,
                                                                            std::size_t)) {
        auto c = std::make_shared<C>(*io_);
        acceptor.async_accept(c->sock, [this, &acceptor, on_head, c](asio::error_code e) {
            if (finished_) return;
            if (e) return gate_.accept_failed(e, [this, &acceptor, on_head] { accept_loop(acceptor, on_head); });
            gate_.admit(c);
            accept_loop(acceptor, on_head);
            // The challenge goes out at once; its answer is the handshake (a failed write ends
            // in a failed read).
            asio::async_write(c->sock, asio::buffer(c->challenge.bytes), [c](asio::error_code, std::size_t) {});
            asio::async_read(c->sock, asio::buffer(c->head), [this, on_head, c](asio::error_code e2, std::size_t got) {
                if (!finished_) (this->*on_head)(c, e2, got);
            });
        });
    }


    tcp_config& cfg_;
    rank_t me_;
    std::size_t n_;
    std::unique_ptr<asio::io_context> io_;
    std::chrono::steady_clock::time_point deadline_;
    std::string where_, advertised_, fatal_;
    asio::ip::address master_ip_;
    tcp family_ = tcp::v4();
    bool finished_ = false;
    tcp_timers timers_;  // connection retries, none after drain()
    // 1. listen
    tcp::acceptor listener_;
    std::uint16_t my_port_ = 0;
    std::optional<tcp::acceptor> master_;
    // 2.-3. hello and table, this rank's side
    tcp::socket to_master_;
    milliseconds backoff_{5};
    std::size_t turned_away_ = 0;  // connections the master closed before its challenge or table
    bool master_seen_ = false;  // a challenge came: the master listens, until it ends
    std::vector<unsigned char> hello_, table_in_;
    std::array<unsigned char, 8> table_len_{};
    std::array<unsigned char, tcp_wire::refusal_head_size> refusal_head_{};
    std::vector<unsigned char> refusal_text_;
    errc refused_code_ = errc::connection_failed;  // what fatal_ is, from the master's refusal
    rank_t refused_blame_ = -1;
    bool awaiting_table_ = false;  // the hello went out; the master's table or refusal is due
    std::array<unsigned char, tcp_wire::challenge_size> challenge_in_{};  // the master's
    bool have_table_ = false;
    // 2.-3. the master's side
    std::vector<std::shared_ptr<joiner>> joined_;
    std::size_t joined_count_ = 0, tables_sent_ = 0;
    std::vector<unsigned char> table_;
    // 4. mesh
    std::vector<std::unique_ptr<tcp::socket>> sockets_;
    std::vector<tcp::endpoint> endpoints_;
    std::list<std::shared_ptr<tcp::socket>> connecting_;
    tcp_gate gate_;  // the connections accepted, until they proved to be ranks of this job
    std::vector<bool> held_by_;  // by rank: both ends hold the connection
    std::vector<unsigned char> ready_in_;  // by rank: its ready, once read
    std::vector<std::size_t> refused_by_;  // by lower rank: connections it closed before accepting
    std::size_t held_ = 0, readies_in_ = 0, readies_out_ = 0;
};

} // namespace chorus::detail
