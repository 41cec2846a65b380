// SPDX-License-Identifier: MIT
// The collectives that read registered shm_buffers where they lie (shm_transport as an
// exposing_transport), against closed-form oracles: ranks as threads (tcp_test.cpp) and as
// processes (process_check --transport shm registered). Throws std::runtime_error naming the
// first wrong element or count.
#pragma once

#include <chorus/chorus.hpp>
#include <chorus/registration.hpp>
#include <chorus/transport/shm.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace registered_check {

inline void require(bool ok, std::string const& what) {
    if (!ok) throw std::runtime_error(what);
}

// The message is built only for a wrong element: the checks run over millions.
template <class T>
void require_equal(std::span<T const> got, std::size_t at, double expected, std::string const& where, char const* what) {
    if (static_cast<double>(got[at]) == expected) return;
    throw std::runtime_error(where + what + "[" + std::to_string(at) + "] = " + std::to_string(static_cast<double>(got[at])) +
                             ", expected " + std::to_string(expected));
}

/// Every exposed collective (allreduce sum and max, allgather, alltoall, alltoallv,
/// reduce_scatter, broadcast) on ranges of one registered shm_buffer, `n` elements per block:
/// automatic (which must read every buffer where it lies once the blocks pass the one_shot
/// slot, and never below it) and with zero_copy / two_shot named.
template <class T>
void run(chorus::shm_transport& tp, std::size_t n) {
    auto const p = static_cast<std::size_t>(tp.size()), me = static_cast<std::size_t>(tp.rank());
    double const dp = static_cast<double>(p), dme = static_cast<double>(me);
    std::string const where = "n = " + std::to_string(n) + ", p = " + std::to_string(p) + ": ";
    // One allocation, one registration: vec (p n), block (n), gathered (p n), to (p n), from (p n), reduced (n).
    chorus::shm_buffer memory((4 * p + 2) * n * sizeof(T) + sizeof(T));
    std::span<T> const all = memory.as<T>();
    std::span<T> const vec = all.subspan(0, p * n), block = all.subspan(p * n, n), gathered = all.subspan(p * n + n, p * n),
                       to = all.subspan(2 * p * n + n, p * n), from = all.subspan(3 * p * n + n, p * n),
                       reduced = all.subspan(4 * p * n + n, n);
    auto const reg = chorus::register_buffer(tp, all);
    require(reg.kept() && tp.exposes(), where + "a shm_buffer's registration was not kept");
    // alltoallv: rank j sends (n + j + r) % (n + 1) elements to rank r, so counts are symmetric.
    std::vector<std::size_t> counts(p);
    for (std::size_t j = 0; j < p; ++j) counts[j] = (n + j + me) % (n + 1);
    for (int k = 0; k < 2; ++k) {
        bool const named = k == 1;
        double const dk = static_cast<double>(k);
        for (std::size_t i = 0; i < vec.size(); ++i) vec[i] = static_cast<T>(dme + static_cast<double>(i % 13) + dk);
        for (std::size_t i = 0; i < n; ++i) block[i] = static_cast<T>(dme * 1000 + static_cast<double>(i % 997) + dk);
        for (std::size_t j = 0; j < p; ++j)
            for (std::size_t i = 0; i < n; ++i)
                to[j * n + i] = static_cast<T>(dme * 100 + static_cast<double>(j) * 10 + static_cast<double>(i % 7) + dk);
        std::uint64_t const before = tp.exposed_rounds();
        if (named) {
            chorus::allreduce<chorus::two_shot>(tp, vec);
            chorus::allgather<chorus::zero_copy>(tp, std::span<T const>(block), gathered);
            chorus::alltoall<chorus::zero_copy>(tp, std::span<T const>(to), from);
            chorus::reduce_scatter<chorus::zero_copy>(tp, std::span<T const>(to), reduced);
        } else {
            chorus::allreduce(tp, vec);
            chorus::allgather(tp, std::span<T const>(block), gathered);
            chorus::alltoall(tp, std::span<T const>(to), from);
            chorus::reduce_scatter(tp, std::span<T const>(to), reduced);
        }
        double const ranks = dp * (dp - 1) / 2;
        for (std::size_t i = 0; i < vec.size(); ++i)
            require_equal<T>(vec, i, ranks + dp * (static_cast<double>(i % 13) + dk), where, "allreduce sum");
        for (std::size_t x = 0; x < gathered.size(); ++x)
            require_equal<T>(gathered, x, static_cast<double>(x / n) * 1000 + static_cast<double>((x % n) % 997) + dk, where, "allgather");
        for (std::size_t x = 0; x < from.size(); ++x)
            require_equal<T>(from, x, static_cast<double>(x / n) * 100 + dme * 10 + static_cast<double>((x % n) % 7) + dk, where, "alltoall");
        for (std::size_t i = 0; i < n; ++i)
            require_equal<T>(reduced, i, 100 * ranks + dp * (dme * 10 + static_cast<double>(i % 7) + dk), where, "reduce_scatter");
        // The element counts each step's expectations are computed from, as the automatic
        // choice sees them (select.hpp, prefer_direct): above the slot, every rank's buffer is
        // read where it lies (two_shot: two rounds; the others: one).
        std::size_t const slot = tp.direct_bytes();
        bool const big = n * sizeof(T) > slot, small = p * n * sizeof(T) <= slot;  // every block above, or all below
        if (!named && p > 1 && (big || small)) {
            std::uint64_t const expected = big ? 5 : 0;
            require(tp.exposed_rounds() - before == expected, where + "automatic collectives read " +
                                                                  std::to_string(tp.exposed_rounds() - before) +
                                                                  " rounds where they lie, expected " + std::to_string(expected));
        }
        if (named && p > 1 && n > 0)
            require(tp.exposed_rounds() - before == 5, where + "zero_copy and two_shot read " +
                                                           std::to_string(tp.exposed_rounds() - before) + " rounds where they lie, expected 5");
        // max, and a broadcast from the last rank, and alltoallv.
        for (std::size_t i = 0; i < vec.size(); ++i) vec[i] = static_cast<T>(static_cast<double>((i + me) % p) + dk);
        if (named) chorus::allreduce<chorus::two_shot>(tp, vec, chorus::maximum{});
        else chorus::allreduce(tp, vec, chorus::maximum{});
        for (std::size_t i = 0; i < vec.size(); ++i) require_equal<T>(vec, i, dp - 1 + dk, where, "allreduce max");
        auto const root = static_cast<chorus::rank_t>(p - 1);
        if (me != p - 1)
            for (auto& x : gathered) x = static_cast<T>(-1);  // what the root's block must replace
        if (named) chorus::broadcast<chorus::zero_copy>(tp, gathered, root);
        else chorus::broadcast(tp, gathered, root);
        for (std::size_t x = 0; x < gathered.size(); ++x)
            require_equal<T>(gathered, x, static_cast<double>(x / n) * 1000 + static_cast<double>((x % n) % 997) + dk, where, "broadcast");
        std::size_t sent = 0;
        for (std::size_t j = 0; j < p; ++j)
            for (std::size_t t = 0; t < counts[j]; ++t, ++sent)
                to[sent] = static_cast<T>(dme * 100 + static_cast<double>(j) * 10 + static_cast<double>(t % 7) + dk);
        std::span<T const> const sending(to.data(), sent);
        std::span<T> const receiving(from.data(), sent);  // symmetric counts: as many come as go
        if (named) chorus::alltoallv<chorus::zero_copy>(tp, sending, counts, receiving, counts);
        else chorus::alltoallv(tp, sending, counts, receiving, counts);
        std::size_t got = 0;
        for (std::size_t r = 0; r < p; ++r)
            for (std::size_t t = 0; t < counts[r]; ++t, ++got)
                require_equal<T>(from, got, static_cast<double>(r) * 100 + dme * 10 + static_cast<double>(t % 7) + dk, where, "alltoallv");
    }
    chorus::deregister_buffer(tp, reg);
    require(!tp.exposes(), where + "a registration outlived deregister_buffer");
}

} // namespace registered_check
