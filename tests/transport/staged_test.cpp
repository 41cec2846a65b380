// SPDX-License-Identifier: MIT
// The staged protocol (transport/staged.hpp, CUDA IPC's) without a GPU and without Asio: the
// host model of a device (support/host_model_device.hpp) and a loopback control channel.
// tcp_test.cpp runs the conformance suite over a TCP control channel too, as cuda_ipc uses.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/staged.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../support/collective_matrix.hpp"
#include "../support/conformance.hpp"
#include "../support/host_model_device.hpp"

using chorus::rank_t;
using namespace std::chrono_literals;

namespace {

/// The staged protocol over the host model with FIFOs of 3 slots of 256 bytes (messages of
/// more than 768 bytes wait for credits, and most messages are several chunks), its control
/// channel a loopback group. A rank that throws aborts its transport before destroying it, so
/// that the others fail at once instead of waiting for its goodbye.
using staged_model = chorus::staged_transport<testing_support::host_model_device, chorus::loopback_transport>;
static_assert(chorus::transport<staged_model>);
static_assert(chorus::host_transport<staged_model>);
static_assert(chorus::staged_device<testing_support::host_model_device>);
static_assert(chorus::control_transport<chorus::loopback_transport>);

struct staged_runner {
    template <class Fn>
    static void run(rank_t p, Fn&& fn, std::chrono::milliseconds timeout) {
        chorus::run_ranks(p, [&](chorus::loopback_transport& control) {
            std::optional<staged_model> tp;
            try {
                tp.emplace(std::move(control), chorus::staged_config{256, 3}, testing_support::host_model_device{});
                fn(*tp);
            } catch (std::exception const& e) {
                if (tp) tp->abort(e.what());
                throw;
            }
        }, {.timeout = timeout});
    }
};

} // namespace

TEST_CASE_TEMPLATE_INVOKE(transport_conformance, staged_runner);

TEST_CASE("staged protocol (host model): the collective matrix at 1 to 4 ranks") {
    for (rank_t p : {1, 2, 3, 4}) {
        CAPTURE(p);
        oracle::failures f;
        staged_runner::run(p, [&](staged_model& tp) { checks::all(tp, f); }, 60s);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

TEST_CASE("staged protocol (host model): messages of many chunks, unexpected and late, stay whole and in order") {
    staged_runner::run(3, [](staged_model& tp) {
        rank_t const me = tp.rank(), p = tp.size();
        auto const word = [](rank_t from, rank_t to, std::size_t k, std::size_t i) {
            return static_cast<std::uint32_t>(static_cast<std::size_t>(from) * 100000 + static_cast<std::size_t>(to) * 10000 + k * 1000 + i);
        };
        // Every rank sends 5 messages per peer (sizes around the slot and FIFO sizes) before
        // receiving any: all but the first FIFO-full of each are staged as unexpected.
        std::vector<std::size_t> const sizes{0, 1, 255, 257, 3000};
        std::vector<std::vector<std::uint32_t>> out;
        std::vector<staged_model::request> sends;
        for (rank_t peer = 0; peer < p; ++peer)
            for (std::size_t k = 0; k < sizes.size(); ++k) {
                auto& v = out.emplace_back(sizes[k]);
                for (std::size_t i = 0; i < v.size(); ++i) v[i] = word(me, peer, k, i);
            }
        std::size_t m = 0;
        for (rank_t peer = 0; peer < p; ++peer)
            for (std::size_t k = 0; k < sizes.size(); ++k, ++m)
                sends.push_back(tp.isend(peer, 40 + k % 2, conformance::bytes(out[m])));
        // Receive in reverse peer order, odd tags first: matching must follow (sender, tag).
        for (rank_t peer = p - 1; peer >= 0; --peer)
            for (std::size_t parity : {1u, 0u})
                for (std::size_t k = 0; k < sizes.size(); ++k) {
                    if (k % 2 != parity) continue;
                    std::vector<std::uint32_t> in(sizes[k]);
                    tp.irecv(peer, 40 + k % 2, conformance::bytes(in)).wait();
                    for (std::size_t i = 0; i < in.size(); ++i)
                        if (in[i] != word(peer, me, k, i))
                            throw std::runtime_error("message " + std::to_string(k) + " from " + std::to_string(peer) + " wrong at " + std::to_string(i));
                }
        for (auto& s : sends) s.wait();
        CHECK(tp.device().copies > 0);
        CHECK(testing_support::host_model_device::open_handles.load() > 0);
    }, 20s);
    // Every rank closed the FIFOs it had opened (in its destructor, before the goodbye).
    CHECK(testing_support::host_model_device::open_handles.load() == 0);
}

TEST_CASE("staged protocol (host model): a device error or a wrong current device fails the collective on every rank, with its text") {
    for (bool const copy_fails : {true, false}) {
        CAPTURE(copy_fails);
        std::mutex mutex;
        std::vector<std::string> errors(3, "no error");
        staged_runner::run(3, [&](staged_model& tp) {
            if (tp.rank() == 0) (copy_fails ? tp.device().fail_copies : tp.device().wrong_device) = true;
            std::vector<std::uint32_t> v(100, 1);
            try {
                chorus::allreduce<chorus::ring>(tp, v, chorus::sum{});
            } catch (chorus::error const& e) {
                std::lock_guard lock(mutex);
                errors[static_cast<std::size_t>(tp.rank())] = e.what();
            }
        }, 20s);
        char const* const want = copy_fails ? "host model: copy failed (injected)" : "current device is not the transport's";
        for (auto const& e : errors) CHECK_MESSAGE(e.find(want) != std::string::npos, e);
    }
}

TEST_CASE("staged protocol (host model): a clean group frees its FIFOs, a failed one abandons them") {
    using device = testing_support::host_model_device;
    auto released = device::released_fifos.load(), abandoned = device::abandoned_fifos.load();
    staged_runner::run(3, [](staged_model& tp) { chorus::barrier(tp); }, 20s);
    CHECK(device::released_fifos.load() - released == 3);
    CHECK(device::abandoned_fifos.load() - abandoned == 0);

    // Rank 1 gives up: nobody says goodbye, so a peer may still hold any FIFO open (on a
    // device, freeing it then is undefined): every rank abandons its own instead.
    released = device::released_fifos.load();
    abandoned = device::abandoned_fifos.load();
    std::atomic<int> failed{0};
    staged_runner::run(3, [&](staged_model& tp) {
        if (tp.rank() == 1) tp.abort("rank 1 gives up");
        std::vector<std::uint32_t> in(4);
        try {
            tp.irecv((tp.rank() + 1) % 3, 5, conformance::bytes(in)).wait();
        } catch (chorus::error const&) {
            ++failed;
        }
    }, 20s);
    CHECK(failed.load() == 3);
    CHECK(device::released_fifos.load() - released == 0);
    CHECK(device::abandoned_fifos.load() - abandoned == 3);
}
