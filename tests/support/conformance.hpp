// SPDX-License-Identifier: MIT
#pragma once

// The transport conformance suite: what every model of chorus::transport must do, checked
// through a Runner (`runner::run(p, fn, timeout)` runs fn(transport&) on p ranks).
// Each transport's test file instantiates it with TEST_CASE_TEMPLATE_INVOKE.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace conformance {

using chorus::rank_t;
using namespace std::chrono_literals;

inline std::span<std::byte const> bytes(std::vector<std::uint32_t> const& v) { return std::as_bytes(std::span(v)); }
inline std::span<std::byte> bytes(std::vector<std::uint32_t>& v) { return std::as_writable_bytes(std::span(v)); }

/// What a rank saw when its operation threw.
struct outcome {
    bool threw = false;
    std::error_code code;
    rank_t peer = -2;
    std::string what;
};

class outcomes {
public:
    explicit outcomes(rank_t p) : list_(static_cast<std::size_t>(p)) {}
    template <class Fn>
    void record(rank_t r, Fn&& fn) {
        try {
            fn();
        } catch (chorus::transport_error const& e) {
            set(r, {true, e.code(), e.peer(), e.what()});
        } catch (chorus::error const& e) {
            set(r, {true, e.code(), -1, e.what()});
        }
    }
    outcome const& operator[](rank_t r) const { return list_[static_cast<std::size_t>(r)]; }

private:
    void set(rank_t r, outcome o) {
        std::lock_guard lock(*mutex_);
        list_[static_cast<std::size_t>(r)] = std::move(o);
    }
    std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();  // movable
    std::vector<outcome> list_;
};

/// one_shot rounds called with different sizes, over a direct_transport: `allreduce_of(n0, n1)`
/// runs an automatic allreduce of n0 doubles on ranks 0 and 2 and n1 on rank 1, and returns
/// what each rank's chorus::error said. When both fit a round (`fit0`, `fit1` doubles), every
/// rank names rank 1's shape in the same words; when rank 1's does not (`over`: it sends
/// messages, the others wait for its block), every rank says so within its wait, not at the
/// timeout (20 s in the runners: 10 s is the bound).
template <class AllreduceOf>
void one_shot_mismatches(AllreduceOf const& allreduce_of, std::size_t fit0, std::size_t fit1, std::size_t over) {
    std::string const shape = "rank 1 called allreduce with " + std::to_string(8 * fit1) + " bytes, rank 0 allreduce with " +
                              std::to_string(8 * fit0) + " bytes";
    for (auto const& e : allreduce_of(fit0, fit1)) {
        CHECK_MESSAGE(e.find(shape) != std::string::npos, e);
        CHECK_MESSAGE(e.find("timed out") == std::string::npos, e);
    }
    auto const start = std::chrono::steady_clock::now();
    for (auto const& e : allreduce_of(fit0, over)) {
        // Over messages ("different sizes"), or where the larger one exposes its vector in a
        // round too (two_shot): the shapes' check ("their sizes differ").
        CHECK_MESSAGE((e.find("different sizes") != std::string::npos || e.find("their sizes differ") != std::string::npos), e);
        CHECK_MESSAGE(e.find("timed out") == std::string::npos, e);
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

} // namespace conformance

TEST_CASE_TEMPLATE_DEFINE("transport conformance", Runner, transport_conformance) {
    using namespace conformance;

    SUBCASE("messages of one sender and tag arrive in order; other tags may overtake") {
        Runner::run(3, [](auto& tp) {
            rank_t const me = tp.rank(), p = tp.size();
            for (rank_t peer = 0; peer < p; ++peer) {
                if (peer == me) continue;
                for (std::uint32_t k = 0; k < 20; ++k) {
                    std::vector<std::uint32_t> msg(k + 1, static_cast<std::uint32_t>(me) * 1000 + k);
                    chorus::send(tp, peer, msg, /*tag=*/1);
                }
                std::vector<std::uint32_t> late{7, 7};
                chorus::send(tp, peer, late, /*tag=*/2);
            }
            for (rank_t peer = 0; peer < p; ++peer) {
                if (peer == me) continue;
                std::vector<std::uint32_t> late(2);
                chorus::recv(tp, peer, late, 2);  // tag 2 was sent last but is received first
                if (late != std::vector<std::uint32_t>{7, 7}) throw std::runtime_error("tag 2 payload wrong");
                for (std::uint32_t k = 0; k < 20; ++k) {
                    std::vector<std::uint32_t> msg(k + 1);
                    chorus::recv(tp, peer, msg, 1);
                    for (auto x : msg)
                        if (x != static_cast<std::uint32_t>(peer) * 1000 + k) throw std::runtime_error("out of order");
                }
            }
        }, 10s);
    }

    SUBCASE("zero-length messages, messages to self, receive posted before or after the send") {
        Runner::run(2, [](auto& tp) {
            rank_t const me = tp.rank(), other = 1 - tp.rank();
            std::vector<std::uint32_t> empty;
            auto r0 = tp.irecv(other, 5, bytes(empty));
            auto s0 = tp.isend(other, 5, bytes(empty));
            s0.wait();
            r0.wait();
            std::vector<std::uint32_t> mine{1, 2, 3}, back(3);
            auto s1 = tp.isend(me, 6, bytes(mine));  // to self, send first
            auto r1 = tp.irecv(me, 6, bytes(back));
            r1.wait();
            s1.wait();
            if (back != mine) throw std::runtime_error("self message wrong");
            r1.wait();  // a second wait returns at once
        }, 10s);
    }

    SUBCASE("test() polls a receive to completion") {
        Runner::run(2, [](auto& tp) {
            std::vector<std::uint32_t> v(1000, static_cast<std::uint32_t>(tp.rank()));
            std::vector<std::uint32_t> in(1000);
            auto r = tp.irecv(1 - tp.rank(), 9, bytes(in));
            auto s = tp.isend(1 - tp.rank(), 9, bytes(v));
            auto const deadline = std::chrono::steady_clock::now() + 10s;
            while (!r.test())
                if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("test() never became true");
            CHECK(r.test());
            s.wait();
            CHECK(in == std::vector<std::uint32_t>(1000, static_cast<std::uint32_t>(1 - tp.rank())));
        }, 10s);
    }

    SUBCASE("many messages in flight between every pair, all sends posted before any receive") {
        Runner::run(4, [](auto& tp) {
            rank_t const me = tp.rank(), p = tp.size();
            constexpr std::uint32_t per_peer = 50;
            std::vector<std::vector<std::uint32_t>> out, in;
            std::vector<typename std::remove_reference_t<decltype(tp)>::request> reqs;
            for (rank_t peer = 0; peer < p; ++peer)
                for (std::uint32_t k = 0; k < per_peer; ++k) out.push_back(std::vector<std::uint32_t>(64 + k, static_cast<std::uint32_t>(me * 100000 + peer * 1000) + k));
            in.resize(out.size());
            std::size_t x = 0;
            for (rank_t peer = 0; peer < p; ++peer)
                for (std::uint32_t k = 0; k < per_peer; ++k, ++x) reqs.push_back(tp.isend(peer, 3, bytes(out[x])));
            x = 0;
            for (rank_t peer = 0; peer < p; ++peer)
                for (std::uint32_t k = 0; k < per_peer; ++k, ++x) {
                    in[x].resize(64 + k);
                    reqs.push_back(tp.irecv(peer, 3, bytes(in[x])));
                }
            for (auto& r : reqs) r.wait();
            x = 0;
            for (rank_t peer = 0; peer < p; ++peer)
                for (std::uint32_t k = 0; k < per_peer; ++k, ++x)
                    if (in[x] != std::vector<std::uint32_t>(64 + k, static_cast<std::uint32_t>(peer * 100000 + me * 1000) + k))
                        throw std::runtime_error("payload wrong");
        }, 20s);
    }

    SUBCASE("a size mismatch is an error naming the sender, and the group fails on every rank") {
        outcomes seen(2);
        Runner::run(2, [&](auto& tp) {
            seen.record(tp.rank(), [&] {
                std::vector<std::uint32_t> v(tp.rank() == 0 ? 4 : 8);
                if (tp.rank() == 0) chorus::send(tp, 1, v);
                else chorus::recv(tp, 0, v);
                chorus::barrier(tp);  // rank 0 learns of the failure here at the latest
            });
        }, 5s);
        CHECK(seen[1].threw);
        CHECK(seen[1].code == chorus::errc::size_mismatch);
        CHECK(seen[1].peer == 0);
        CHECK(seen[1].what.find("rank 0") != std::string::npos);
        CHECK(seen[0].threw);
        CHECK(seen[0].code == chorus::errc::peer_failed);
        CHECK(seen[0].peer == 1);
    }

    SUBCASE("a receive nobody sends times out naming the peer") {
        outcomes seen(2);
        auto const start = std::chrono::steady_clock::now();
        Runner::run(2, [&](auto& tp) {
            seen.record(tp.rank(), [&] {
                if (tp.rank() == 0) {
                    std::vector<std::uint32_t> v(1);
                    chorus::recv(tp, 1, v, 77);
                } else {
                    std::this_thread::sleep_for(800ms);  // in the group, sending nothing (leaving would say so)
                }
            });
        }, 300ms);
        auto const took = std::chrono::steady_clock::now() - start;
        CHECK(seen[0].threw);
        CHECK(seen[0].code == chorus::errc::timeout);
        CHECK(seen[0].peer == 1);
        CHECK(seen[0].what.find("rank 1") != std::string::npos);
        CHECK(took < 5s);
    }

    SUBCASE("abort fails the peers' waits, naming the aborting rank") {
        outcomes seen(3);
        Runner::run(3, [&](auto& tp) {
            seen.record(tp.rank(), [&] {
                if (tp.rank() == 2) {
                    tp.abort("rank 2 gives up");
                    return;
                }
                std::vector<std::uint32_t> v(1);
                chorus::recv(tp, 2, v);
            });
        }, 10s);
        for (rank_t r : {0, 1}) {
            CHECK(seen[r].threw);
            CHECK(seen[r].code == chorus::errc::peer_failed);
            CHECK(seen[r].peer == 2);
            CHECK(seen[r].what.find("gives up") != std::string::npos);
        }
    }
}
