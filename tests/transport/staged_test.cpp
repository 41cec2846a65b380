// SPDX-License-Identifier: MIT
// The staged protocol (transport/staged.hpp, CUDA IPC's) without a GPU and without Asio: the
// host model of a device (support/host_model_device.hpp) and a loopback control channel.
// tcp_test.cpp runs the conformance suite over a TCP control channel too, as cuda_ipc uses.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/staged.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/collective_matrix.hpp"
#include "../support/conformance.hpp"
#include "../support/host_model_device.hpp"

using chorus::rank_t;
using namespace std::chrono_literals;

namespace {

/// The staged protocol over the host model with FIFOs of 3 slots of 256 bytes (messages of
/// more than 768 bytes wait for credits, and most messages are several chunks), direct
/// slots of 1 KiB (one_shot collectives of the matrix's large size take dozens of rounds) and
/// messages of 2 KiB or more by rendezvous (the matrix's large ones), its control channel a
/// loopback group (tcp_test.cpp runs the suite with chunks alone). A rank that throws aborts its transport before destroying it, so
/// that the others fail at once instead of waiting for its goodbye.
using staged_model = chorus::staged_transport<testing_support::host_model_device, chorus::loopback_transport>;
static_assert(chorus::transport<staged_model>);
static_assert(chorus::host_transport<staged_model>);
static_assert(chorus::direct_transport<staged_model>);
static_assert(chorus::staged_device<testing_support::host_model_device>);
static_assert(chorus::control_transport<chorus::loopback_transport>);

struct staged_runner {
    template <class Fn>
    static void run(rank_t p, Fn&& fn, std::chrono::milliseconds timeout) {
        run_with(p, [](rank_t) { return chorus::staged_config{256, 3, 1024, 2048}; }, fn, timeout);
    }
    /// Rank r's transport (a Model) configured as config_of(r).
    template <class Model = staged_model, class Config, class Fn>
    static void run_with(rank_t p, Config const& config_of, Fn&& fn, std::chrono::milliseconds timeout) {
        chorus::run_ranks(p, [&](chorus::loopback_transport& control) {
            std::optional<Model> tp;
            try {
                rank_t const r = control.rank();
                tp.emplace(std::move(control), config_of(r), typename Model::device_type{});
                fn(*tp);
            } catch (std::exception const& e) {
                if (tp) tp->abort(e.what());
                throw;
            }
        }, {.timeout = timeout});
    }
};

/// Runs fn on p ranks and returns what each rank's chorus::error said ("" for none).
template <class Config, class Fn>
std::vector<std::string> errors_of(rank_t p, Config const& config_of, Fn const& fn, std::chrono::milliseconds timeout = 20s) {
    std::mutex mutex;
    std::vector<std::string> errors(static_cast<std::size_t>(p));
    staged_runner::run_with(p, config_of, [&](staged_model& tp) {
        try {
            fn(tp);
        } catch (chorus::error const& e) {
            std::lock_guard lock(mutex);
            errors[static_cast<std::size_t>(tp.rank())] = e.what();
        }
    }, timeout);
    return errors;
}

/// Runs body(tp, fifos) at 2, 3 and 5 ranks (either side of the scratch fold: host memory folds
/// pairwise), after a barrier that opened every peer's FIFO (`fifos` handles: what stays open
/// between collectives); then every peer allocation opened for an exposure must have been
/// closed with its transport.
template <class Body>
void exposure_runs(Body const& body) {
    long const open_before = testing_support::host_model_device::open_handles.load();
    for (rank_t p : {2, 3, 5}) {
        CAPTURE(p);
        staged_runner::run(p, [&](staged_model& tp) {
            chorus::barrier(tp);
            long const fifos = tp.device().open_here;
            CHECK(fifos == p - 1);
            body(tp, fifos);
        }, 60s);
    }
    CHECK(testing_support::host_model_device::open_handles.load() == open_before);
}

} // namespace

TEST_CASE_TEMPLATE_INVOKE(transport_conformance, staged_runner);

// The matrix in four test cases, each well inside ctest's timeout under ThreadSanitizer on a
// slow 2-core machine (whole, it took a minute alone on a 2-core VM and over three on CI
// beside other tests).
namespace {
// With signaled launches (one_shot allreduces, broadcasts, allgathers, reduce_scatters and
// alltoalls of up to 1 KiB run whole on the "device"); the one_shot rounds of those sizes are
// checked in the 16 KiB test.
template <class Check>
void staged_matrix(std::initializer_list<rank_t> ranks, Check const& check, bool signals = false) {
    for (rank_t p : ranks) {
        CAPTURE(p);
        oracle::failures f;
        staged_runner::run_with(p, [&](rank_t) { return chorus::staged_config{256, 3, 1024, 2048, signals}; },
                                [&](staged_model& tp) { check(tp, f); }, 60s);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}
} // namespace

TEST_CASE("staged protocol (host model): the collective matrix at 1 to 3 ranks, reductions") {
    staged_matrix({1, 2, 3}, [](staged_model& tp, oracle::failures& f) { checks::reductions(tp, f); }, /*signals=*/true);
}

TEST_CASE("staged protocol (host model): the collective matrix at 4 ranks, reductions") {
    staged_matrix({4}, [](staged_model& tp, oracle::failures& f) { checks::reductions(tp, f); }, /*signals=*/true);
}

TEST_CASE("staged protocol (host model): the collective matrix at 1 to 3 ranks, data movement") {
    staged_matrix({1, 2, 3}, [](staged_model& tp, oracle::failures& f) { checks::movement(tp, f); }, /*signals=*/true);
}

TEST_CASE("staged protocol (host model): the collective matrix at 4 ranks, data movement") {
    staged_matrix({4}, [](staged_model& tp, oracle::failures& f) { checks::movement(tp, f); }, /*signals=*/true);
}

TEST_CASE("staged protocol (host model): one_shot in one round of 16 KiB slots, one copy into the slot and no message") {
    // The matrix above runs every one_shot collective over 1 KiB slots (many rounds); here
    // the slots of CUDA IPC's kind, 16 KiB: the same collectives in one round each.
    auto const config = [](rank_t) { return chorus::staged_config{256, 3, 16 * 1024}; };
    for (rank_t p : {1, 2, 3, 4}) {
        CAPTURE(p);
        oracle::failures f;
        staged_runner::run_with(p, config, [&](staged_model& tp) {
            checks::one_shot_collectives(tp, f);
            // The automatic choice takes one round for a small allreduce: the block's copy into
            // this rank's slot is its only device copy (messages would copy twice per peer).
            std::vector<double> v(100, tp.rank() + 1.0);
            long const before = tp.device().copies;
            chorus::allreduce(tp, v);
            CHECK(tp.device().copies - before == 1);
            for (double x : v) REQUIRE(x == tp.size() * (tp.size() + 1) / 2.0);
        }, 60s);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

TEST_CASE("staged protocol (host model): one_shot folds every rank's block in one pass where the memory space can (as a kernel on a GPU)") {
    using folding_model = chorus::staged_transport<testing_support::folding_host_model_device, chorus::loopback_transport>;
    static_assert(chorus::direct_transport<folding_model>);
    // Rank order, in place and not, an op with a finish (avg) and one that does not commute.
    struct affine {  // a * 3 + b: the order of the operands shows in the result
        long long operator()(long long a, long long b) const noexcept { return a * 3 + b; }
    };
    auto const value = [](rank_t r, std::size_t i) { return static_cast<long long>(r) * 1000 + static_cast<long long>(i); };
    for (rank_t p : {2, 3, 4}) {
        CAPTURE(p);
        long const folds = testing_support::folding_host_memory::folds.load();
        staged_runner::run_with<folding_model>(p, [](rank_t) { return chorus::staged_config{256, 3, 256}; }, [&](folding_model& tp) {
            std::size_t const n = 45;  // 360 bytes: two rounds of 32 elements and 13
            std::vector<long long> v(n), w(n), x(n), out(n * static_cast<std::size_t>(p)), rs(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = w[i] = x[i] = value(tp.rank(), i);
            chorus::allreduce<chorus::one_shot>(tp, std::span(v), affine{});
            chorus::allreduce<chorus::one_shot>(tp, std::span(w), chorus::avg{});
            chorus::allreduce<chorus::two_shot>(tp, std::span(x), affine{});  // its slice in one pass, in place
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = value(tp.rank(), i) + 7;
            chorus::reduce_scatter<chorus::one_shot>(tp, std::span<long long const>(out), std::span(rs), affine{});
            auto const me = static_cast<std::size_t>(tp.rank());
            for (std::size_t i = 0; i < n; ++i) {
                long long folded = value(0, i), sum = value(0, i), scattered = value(0, me * n + i) + 7;
                for (rank_t r = 1; r < p; ++r) {
                    folded = folded * 3 + value(r, i);
                    sum += value(r, i);
                    scattered = scattered * 3 + value(r, me * n + i) + 7;
                }
                REQUIRE(v[i] == folded);
                REQUIRE(x[i] == folded);
                REQUIRE(w[i] == sum / p);
                REQUIRE(rs[i] == scattered);
            }
        }, 20s);
        // A pass per round on every rank up to max_fold ranks: the one_shot allreduces take 2
        // rounds of 32 elements, two_shot one fold, the reduce_scatter rounds of 256 / (8 p)
        // elements of every block.
        std::size_t const k = 256 / (8 * static_cast<std::size_t>(p)), rounds = 2 + 2 + 1 + (45 + k - 1) / k;
        long const passes = testing_support::folding_host_memory::folds.load() - folds;
        CHECK(passes == (p <= 3 ? static_cast<long>(rounds) * p : 0));
    }
}

TEST_CASE("staged protocol (host model): two_shot reads every rank's vector where it lies: no device copy, each peer's memory opened once and closed before returning") {
    // Rank counts on either side of the scratch fold (host memory folds pairwise), vectors that
    // do not divide by p, and many distinct buffers alive at once.
    exposure_runs([&](staged_model& tp, long fifos) {
        rank_t const p = tp.size();
        auto const me = tp.rank();
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{20011}}) {
            std::vector<std::vector<double>> buffers;  // alive together: distinct memory
            for (int k = 0; k < 12; ++k) {
                auto& v = buffers.emplace_back(n + static_cast<std::size_t>(k));
                for (std::size_t i = 0; i < v.size(); ++i) v[i] = me * 0.5 + static_cast<double>(i % 97);
                long const copies = tp.device().copies, exports = tp.device().exports, opens = tp.device().opens;
                chorus::allreduce<chorus::two_shot>(tp, v);
                CHECK(tp.device().copies == copies);       // read in place: nothing staged
                CHECK(tp.device().exports == exports + 1);  // once: round 2 re-sends round 1's
                CHECK(tp.device().opens == opens + p - 1);  // each peer's once, for both rounds
                CHECK(tp.device().open_here == fifos);      // and closed: the caller may free it
                for (std::size_t i = 0; i < v.size(); ++i)
                    REQUIRE(v[i] == p * static_cast<double>(i % 97) + 0.5 * (p * (p - 1) / 2));
            }
        }
        // The automatic choice takes it above one_shot's slot (1 KiB in these tests).
        std::vector<float> large(5000, 1.0f);
        long const exports = tp.device().exports;
        chorus::allreduce(tp, large, chorus::maximum{});
        CHECK(tp.device().exports == exports + 1);
        for (float x : large) REQUIRE(x == 1.0f);
    });
}

TEST_CASE("staged protocol (host model): zero_copy broadcast, allgather, reduce_scatter and alltoall read the buffers where they lie: no device copy, every opening closed before returning") {
    // Blocks of sizes that do not divide by anything in particular, many buffers alive at once
    // (distinct memory), every root; the counters say that nothing was staged, each exposing
    // rank exported once and each reader opened each peer it read once.
    exposure_runs([&](staged_model& tp, long fifos) {
        rank_t const p = tp.size();
        auto const me = tp.rank();
        auto const up = static_cast<std::size_t>(p);
        auto& device = tp.device();
        // Runs one collective and checks the counters: `exported` buffers of this rank,
        // `opened` peers' allocations.
        auto const counted = [&](char const* what, long exported, long opened, auto&& collective) {
            CAPTURE(what);
            long const copies = device.copies, exports = device.exports, opens = device.opens;
            collective();
            CHECK(device.copies == copies);
            CHECK(device.exports == exports + exported);
            CHECK(device.opens == opens + opened);
            CHECK(device.open_here == fifos);
        };
        auto const value = [](rank_t r, std::size_t i) { return static_cast<int>(r) * 100000 + static_cast<int>(i % 9973); };
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4099}}) {
            CAPTURE(n);
            std::deque<std::vector<int>> kept;  // alive together: distinct memory (a deque: references stay)
            for (rank_t root = 0; root < p; ++root) {
                auto& v = kept.emplace_back(n, -1);
                if (me == root)
                    for (std::size_t i = 0; i < n; ++i) v[i] = value(root, i);
                counted("broadcast", me == root ? 1 : 0, me == root ? 0 : 1, [&] { chorus::broadcast<chorus::zero_copy>(tp, v, root); });
                for (std::size_t i = 0; i < n; ++i) REQUIRE(v[i] == value(root, i));
            }
            auto& mine = kept.emplace_back(n);
            for (std::size_t i = 0; i < n; ++i) mine[i] = value(me, i);
            auto& all = kept.emplace_back(up * n, -1);
            counted("allgather", 1, p - 1, [&] { chorus::allgather<chorus::zero_copy>(tp, mine, all); });
            for (std::size_t x = 0; x < all.size(); ++x) REQUIRE(all[x] == value(static_cast<rank_t>(x / n), x % n));
            auto& send = kept.emplace_back(up * n);  // block j for rank j
            for (std::size_t x = 0; x < send.size(); ++x) send[x] = value(me, x) + static_cast<int>(x / n);
            auto& transposed = kept.emplace_back(up * n, -1);
            counted("alltoall", 1, p - 1, [&] { chorus::alltoall<chorus::zero_copy>(tp, send, transposed); });
            for (std::size_t x = 0; x < transposed.size(); ++x)
                REQUIRE(transposed[x] == value(static_cast<rank_t>(x / n), static_cast<std::size_t>(me) * n + x % n) + me);
            auto& reduced = kept.emplace_back(n, -1);
            counted("reduce_scatter", 1, p - 1, [&] { chorus::reduce_scatter<chorus::zero_copy>(tp, send, reduced); });
            for (std::size_t i = 0; i < n; ++i) {
                long long want = 0;
                for (rank_t r = 0; r < p; ++r) want += value(r, static_cast<std::size_t>(me) * n + i) + me;
                REQUIRE(reduced[i] == want);
            }
        }
        // The automatic choice takes them above one_shot's slot (1 KiB in these tests); values that
        // name their rank and block, outputs that start as -1.
        std::size_t const m = 5000;
        std::vector<float> large(m, static_cast<float>(me + 1)), gathered(m * up, -1.0f), out(m * up, -1.0f), part(m / up, -1.0f);
        counted("automatic allgather", 1, p - 1, [&] { chorus::allgather(tp, large, gathered); });
        for (std::size_t x = 0; x < gathered.size(); ++x) REQUIRE(gathered[x] == static_cast<float>(x / m + 1));
        for (std::size_t x = 0; x < gathered.size(); ++x) gathered[x] = static_cast<float>(me * 100 + static_cast<int>(x / m));
        counted("automatic alltoall", 1, p - 1, [&] { chorus::alltoall(tp, gathered, out); });
        for (std::size_t x = 0; x < out.size(); ++x) REQUIRE(out[x] == static_cast<float>(static_cast<int>(x / m) * 100 + me));
        counted("automatic broadcast", me == p - 1 ? 1 : 0, me == p - 1 ? 0 : 1, [&] { chorus::broadcast(tp, large, p - 1); });
        for (float x : large) REQUIRE(x == static_cast<float>(p));
        std::vector<float> whole(part.size() * up);
        for (std::size_t x = 0; x < whole.size(); ++x) whole[x] = static_cast<float>(me + 1) * static_cast<float>(x / part.size() + 1);
        counted("automatic reduce_scatter", 1, p - 1, [&] { chorus::reduce_scatter(tp, whole, part); });
        for (float x : part) REQUIRE(x == static_cast<float>(p * (p + 1) / 2 * (me + 1)));
    });
}

TEST_CASE("staged protocol (host model): zero_copy alltoallv reads each peer's block for this rank where it lies, and opens only the peers that send it something") {
    // Skewed counts with empty blocks, and a rank (the last) that sends only to itself: it
    // exports nothing, and no rank opens it. Packed and with explicit displacements, tagged and
    // automatic (zero_copy once a rank's send buffer passes the 1 KiB slot, else pairwise's
    // messages); the counters say that nothing was staged.
    exposure_runs([&](staged_model& tp, long fifos) {
        rank_t const p = tp.size();
        auto const me = tp.rank();
        auto const up = static_cast<std::size_t>(p);
        auto& device = tp.device();
        auto const element = [](rank_t i, rank_t j, std::size_t k) { return i * 1000000 + j * 10000 + static_cast<int>(k); };
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
            CAPTURE(n);
            auto const count = [&](rank_t i, rank_t j) -> std::size_t {
                if (i == p - 1) return i == j ? n : 0;
                return static_cast<std::size_t>((i * 3 + j * 5) % 4) * n;
            };
            std::vector<std::size_t> sc(up), rc(up), rd(up);
            std::vector<int> send, want;
            long exported = 0, opened = 0;
            for (rank_t j = 0; j < p; ++j) {
                sc[static_cast<std::size_t>(j)] = count(me, j);
                rc[static_cast<std::size_t>(j)] = count(j, me);
                for (std::size_t k = 0; k < count(me, j); ++k) send.push_back(element(me, j, k));
                if (j != me && count(me, j) > 0) exported = 1;
                if (j != me && count(j, me) > 0) ++opened;
            }
            // Received blocks in reverse rank order, a gap of one element after each.
            std::size_t offset = 0;
            for (rank_t j = p - 1; j >= 0; --j) {
                rd[static_cast<std::size_t>(j)] = offset;
                offset += count(j, me) + 1;
            }
            std::vector<int> spaced_want(offset, -7);
            for (rank_t j = 0; j < p; ++j) {
                for (std::size_t k = 0; k < count(j, me); ++k) {
                    want.push_back(element(j, me, k));
                    spaced_want[rd[static_cast<std::size_t>(j)] + k] = element(j, me, k);
                }
            }
            std::vector<std::size_t> sd(up);
            for (std::size_t j = 1; j < up; ++j) sd[j] = sd[j - 1] + sc[j - 1];
            std::size_t largest = 0;  // of the ranks' send buffers, in bytes
            for (rank_t i = 0; i < p; ++i) {
                std::size_t total = 0;
                for (rank_t j = 0; j < p; ++j) total += count(i, j);
                largest = std::max(largest, total * sizeof(int));
            }
            for (bool automatic : {false, true}) {
                CAPTURE(automatic);
                std::vector<int> recv(want.size(), -1), spaced(offset, -7);
                long const copies = device.copies, exports = device.exports, opens = device.opens;
                if (automatic) {
                    chorus::alltoallv(tp, send, sc, recv, rc);
                    chorus::alltoallv(tp, send, sc, sd, spaced, rc, rd);
                } else {
                    chorus::alltoallv<chorus::zero_copy>(tp, send, sc, recv, rc);
                    chorus::alltoallv<chorus::zero_copy>(tp, send, sc, sd, spaced, rc, rd);
                }
                if (!automatic || largest > tp.direct_bytes()) {
                    CHECK(device.copies == copies);
                    CHECK(device.exports == exports + 2 * exported);
                    CHECK(device.opens == opens + 2 * opened);
                } else {  // pairwise: chunks through the FIFOs (rank 0 sends rank 1 something)
                    CHECK(device.copies > copies);
                    CHECK(device.exports == exports);
                    CHECK(device.opens == opens);
                }
                CHECK(device.open_here == fifos);
                CHECK(recv == want);
                CHECK(spaced == spaced_want);
            }
        }
    });
}

TEST_CASE("staged protocol (host model): zero_copy alltoallv with counts that disagree fails every rank alike, naming the sender") {
    // Rank 0 sends rank 2 four elements; rank 2 expects five. Rank 2 copies nothing and tells
    // the others in the closing round, once none reads its buffer (its vector is freed as the
    // error unwinds: ASan would see a read after that).
    auto const errors = errors_of(3, [](rank_t) { return chorus::staged_config{256, 3, 1024}; }, [](staged_model& tp) {
        std::vector<int> const sc{4, 4, 4};
        std::vector<int> rc{4, 4, 4};
        if (tp.rank() == 2) rc[0] = 5;
        std::vector<float> send(12, 1.0f), recv(static_cast<std::size_t>(rc[0] + rc[1] + rc[2]), -1.0f);
        chorus::alltoallv<chorus::zero_copy>(tp, send, sc, recv, rc);
    });
    for (auto const& e : errors)
        CHECK_MESSAGE(e.find("rank 2 expects 20 bytes from rank 0, which sends another size") != std::string::npos, e);
}

TEST_CASE("staged protocol (host model): zero_copy falls back to the schedules of messages where a rank's memory cannot be exported, on every rank alike") {
    // Rank 1 refuses: broadcast from it falls back, from another root it is not read (only the
    // root exposes its vector); the others fall back whoever refuses.
    staged_runner::run(3, [&](staged_model& tp) {
        tp.device().refuse_export = tp.rank() == 1;
        chorus::barrier(tp);
        auto& device = tp.device();
        long const opened = device.open_here;
        auto const me = tp.rank();
        for (rank_t root : {0, 1}) {
            std::vector<double> v(777, me == root ? 2.5 : 0.0);
            long const copies = device.copies;
            chorus::broadcast<chorus::zero_copy>(tp, v, root);
            CHECK((device.copies > copies) == (root == 1));  // the tree's chunks only where it fell back
            for (double x : v) REQUIRE(x == 2.5);
        }
        std::vector<long long> mine(301, me + 1), all(903), t(903);
        long const copies = device.copies;
        chorus::allgather<chorus::zero_copy>(tp, mine, all);
        for (std::size_t x = 0; x < all.size(); ++x) REQUIRE(all[x] == static_cast<long long>(x / 301 + 1));
        chorus::alltoall<chorus::zero_copy>(tp, all, t);
        for (std::size_t x = 0; x < t.size(); ++x) REQUIRE(t[x] == me + 1);
        std::vector<long long> rs(301);
        chorus::reduce_scatter<chorus::zero_copy>(tp, all, rs);
        for (long long x : rs) REQUIRE(x == 3 * (me + 1));
        // alltoallv: the refusing rank, when it sends nobody else anything, exports nothing and
        // the others still read each other in place; when it sends, every rank falls back.
        for (bool refusing_sends : {false, true}) {
            CAPTURE(refusing_sends);
            auto const count = [&](rank_t i, rank_t j) { return i == 1 && !refusing_sends && j != 1 ? 0 : 50 * (j + 1); };
            std::vector<int> sc(3), rc(3);
            for (rank_t j = 0; j < 3; ++j) sc[static_cast<std::size_t>(j)] = count(me, j), rc[static_cast<std::size_t>(j)] = count(j, me);
            std::vector<long long> vs(static_cast<std::size_t>(sc[0] + sc[1] + sc[2]), me + 1),
                vr(static_cast<std::size_t>(rc[0] + rc[1] + rc[2]), -1);
            long const before = device.copies;
            chorus::alltoallv<chorus::zero_copy>(tp, vs, sc, vr, rc);
            CHECK((device.copies > before) == refusing_sends);
            std::size_t x = 0;
            for (rank_t i = 0; i < 3; ++i)
                for (int k = 0; k < rc[static_cast<std::size_t>(i)]; ++k) REQUIRE(vr[x++] == i + 1);
        }
        CHECK(device.copies > copies);
        CHECK(device.open_here == opened);  // nothing opened for a round that fell back
    }, 20s);
}

TEST_CASE("staged protocol (host model): a registered buffer is exported and opened once for all the collectives on it, and closed when deregistered") {
    static_assert(chorus::registering_transport<staged_model>);
    static_assert(!chorus::putting_transport<staged_model>);  // its broadcast: every receiver reads the whole vector
    exposure_runs([&](staged_model& tp, long fifos) {
        rank_t const p = tp.size();
        auto const me = tp.rank();
        auto const up = static_cast<std::size_t>(p);
        auto& device = tp.device();
        // One registered buffer holds a vector (at an offset) and a block to gather.
        std::size_t const n = 10001, block = 3001;
        std::vector<double> arena(5 + n + block);
        std::span<double> const vec = std::span(arena).subspan(5, n), part = std::span(arena).subspan(5 + n, block);
        long exports = device.exports, opens = device.opens;
        auto const reg = chorus::register_buffer(tp, arena);
        CHECK(reg.kept());
        CHECK(device.exports == exports + 1);
        CHECK(device.opens == opens + p - 1);
        CHECK(device.open_here == fifos + p - 1);
        std::vector<double> gathered(block * up), loose(n);
        // alltoallv of `part`: rank j gets a share of every rank's block (the last the rest).
        std::vector<std::size_t> shares(up, block / up);
        shares.back() = block - (up - 1) * (block / up);
        std::vector<std::size_t> const from(up, shares[static_cast<std::size_t>(me)]);
        std::vector<double> dispatched(up * from[0]);
        for (int k = 0; k < 4; ++k) {
            CAPTURE(k);
            for (std::size_t i = 0; i < n; ++i) vec[i] = loose[i] = me + k + static_cast<double>(i % 13);
            for (std::size_t i = 0; i < block; ++i) part[i] = me * 1000.0 + static_cast<double>(i) + k;
            exports = device.exports, opens = device.opens;
            long const copies = device.copies;
            chorus::allreduce<chorus::two_shot>(tp, vec);
            chorus::allgather<chorus::zero_copy>(tp, part, gathered);
            chorus::alltoallv<chorus::zero_copy>(tp, std::span<double const>(part), shares, dispatched, from);
            chorus::broadcast<chorus::zero_copy>(tp, part, p - 1);
            CHECK(device.exports == exports);  // by the registration: no query,
            CHECK(device.opens == opens);      // no open,
            CHECK(device.copies == copies);    // no staging
            CHECK(device.open_here == fifos + p - 1);
            // A buffer outside it: exported and opened for the call, closed before it returned.
            chorus::allreduce<chorus::two_shot>(tp, loose);
            CHECK(device.exports == exports + 1);
            CHECK(device.opens == opens + p - 1);
            CHECK(device.open_here == fifos + p - 1);
            double const sum = p * (p - 1) / 2.0;
            for (std::size_t i = 0; i < n; ++i) {
                REQUIRE(vec[i] == sum + p * (k + static_cast<double>(i % 13)));
                REQUIRE(loose[i] == vec[i]);
            }
            for (std::size_t x = 0; x < gathered.size(); ++x)
                REQUIRE(gathered[x] == static_cast<double>(x / block) * 1000.0 + static_cast<double>(x % block) + k);
            for (std::size_t i = 0; i < block; ++i) REQUIRE(part[i] == (p - 1) * 1000.0 + static_cast<double>(i) + k);
            for (std::size_t x = 0; x < dispatched.size(); ++x)  // rank j's share for me, at me * (block / p) of its part
                REQUIRE(dispatched[x] == static_cast<double>(x / from[0]) * 1000.0 +
                                             static_cast<double>(static_cast<std::size_t>(me) * (block / up) + x % from[0]) + k);
        }
        {
            // A registered range and an unregistered one in one allocation (one handle: the host
            // model's 4 KiB pieces): a collective on the other range opens the allocation again
            // for itself and closes only that opening.
            auto* const raw = static_cast<double*>(::operator new(4096, std::align_val_t{4096}));
            std::span<double> const inside(raw, 200), beside(raw + 256, 200);
            auto const small = chorus::register_buffer(tp, inside);
            CHECK(device.open_here == fifos + 2 * (p - 1));
            std::ranges::fill(inside, 2.0);
            std::ranges::fill(beside, 1.0);
            opens = device.opens;
            chorus::allreduce<chorus::two_shot>(tp, beside);
            CHECK(device.opens == opens + p - 1);
            CHECK(device.open_here == fifos + 2 * (p - 1));
            chorus::allreduce<chorus::two_shot>(tp, inside);
            CHECK(device.opens == opens + p - 1);  // through the registration
            for (std::size_t i = 0; i < 200; ++i) {
                REQUIRE(beside[i] == p);
                REQUIRE(inside[i] == 2.0 * p);
            }
            chorus::deregister_buffer(tp, small);
            CHECK(device.open_here == fifos + p - 1);  // the first registration's still open
            ::operator delete(raw, std::align_val_t{4096});
        }
        chorus::deregister_buffer(tp, reg);
        CHECK(device.open_here == fifos);  // every rank may free its buffer now
        exports = device.exports;
        chorus::allreduce<chorus::two_shot>(tp, vec);
        CHECK(device.exports == exports + 1);  // exported per call again
        // A registration a rank cannot export keeps nothing, on every rank; the collectives
        // then run as without it (the ring here).
        device.refuse_export = me == p - 1;
        auto const refused = chorus::register_buffer(tp, loose);
        CHECK_FALSE(refused.kept());
        CHECK(device.open_here == fifos);
        std::ranges::fill(loose, 1.0);
        chorus::allreduce<chorus::two_shot>(tp, loose);
        for (double x : loose) REQUIRE(x == p);
        chorus::deregister_buffer(tp, refused);
        device.refuse_export = false;
        // One left registered: the transport's end closes it (exposure_runs checks).
        auto const left = chorus::register_buffer(tp, gathered);
        CHECK(left.kept());
        CHECK(device.open_here == fifos + p - 1);
    });
}

TEST_CASE("staged protocol (host model): ranks that deregister different registrations fail alike, naming them") {
    auto const errors = errors_of(3, [](rank_t) { return chorus::staged_config{256, 3, 1024}; }, [](staged_model& tp) {
        std::vector<int> a(100), b(200);
        auto const first = chorus::register_buffer(tp, a);
        auto const second = chorus::register_buffer(tp, b);
        chorus::deregister_buffer(tp, tp.rank() == 1 ? second : first);
    });
    for (auto const& e : errors) {
        CHECK_MESSAGE(e.find("rank 1 called deregister_buffer of registration 2") != std::string::npos, e);
        CHECK_MESSAGE(e.find("they end different registrations") != std::string::npos, e);
    }
}

TEST_CASE("staged protocol (host model): two_shot falls back to the ring where a rank's memory cannot be exported, on every rank alike") {
    for (rank_t refusing : {0, 2}) {
        CAPTURE(refusing);
        staged_runner::run(3, [&](staged_model& tp) {
            tp.device().refuse_export = tp.rank() == refusing;
            std::vector<int> v(3001);
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = tp.rank() + static_cast<int>(i);
            chorus::barrier(tp);
            long const copies = tp.device().copies, opened = tp.device().open_here;
            chorus::allreduce<chorus::two_shot>(tp, v);
            CHECK(tp.device().copies > copies);  // the ring's chunks
            CHECK(tp.device().open_here == opened);  // no exposure opened for a round nobody reads
            for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == 3 + 3 * static_cast<int>(i));
        }, 20s);
    }
}

TEST_CASE("staged protocol (host model): ranks that run different algorithms of one collective in rounds fail alike") {
    // Rank 0 exposes its vector (two_shot) while the others copy theirs into slots (one_shot):
    // every rank says so, none reads a block as the other kind.
    auto const errors = errors_of(3, [](rank_t) { return chorus::staged_config{256, 3, 1024}; }, [](staged_model& tp) {
        std::vector<double> v(16, 1.0);
        if (tp.rank() == 0) chorus::allreduce<chorus::two_shot>(tp, v);
        else chorus::allreduce<chorus::one_shot>(tp, v);
    });
    for (auto const& e : errors) CHECK_MESSAGE(e.find("different algorithms") != std::string::npos, e);
    // The same for zero_copy against one_shot, here with the reader's role (rank 2 exposes).
    auto const gathered = errors_of(3, [](rank_t) { return chorus::staged_config{256, 3, 1024}; }, [](staged_model& tp) {
        std::vector<int> mine(8, tp.rank()), all(24);
        if (tp.rank() == 2) chorus::allgather<chorus::zero_copy>(tp, mine, all);
        else chorus::allgather<chorus::one_shot>(tp, mine, all);
    });
    for (auto const& e : gathered) CHECK_MESSAGE(e.find("different algorithms") != std::string::npos, e);
    // alltoallv: rank 1 reads in place while the others send messages (CHORUS_ALGO differs):
    // every rank fails, none waits for its timeout (errors_of's 20 s would end the test).
    auto const v = errors_of(3, [](rank_t) { return chorus::staged_config{256, 3, 1024}; }, [](staged_model& tp) {
        std::vector<int> const counts{5, 5, 5};
        std::vector<int> send(15, tp.rank()), recv(15);
        if (tp.rank() == 1) chorus::alltoallv<chorus::zero_copy>(tp, send, counts, recv, counts);
        else chorus::alltoallv<chorus::pairwise>(tp, send, counts, recv, counts);
    });
    for (auto const& e : v) CHECK_MESSAGE(e.find("run different algorithms of it") != std::string::npos, e);
}

TEST_CASE("staged protocol (host model): a signaled one_shot collective is one launch per call, no control message and no device copy") {
    // Slots of 64 KiB: up to 4 lanes (signals.hpp: 16 KiB each), so that launches of other
    // partitions follow each other on the two slots (the argument that needs no closing barrier).
    auto const config = [](rank_t) { return chorus::staged_config{256, 3, 64 * 1024, 0, true}; };
    static_assert(chorus::signaling_transport<staged_model>);
    for (rank_t p : {2, 3, 5}) {
        CAPTURE(p);
        staged_runner::run_with(p, config, [&](staged_model& tp) {
            REQUIRE(tp.signal_bytes() == 64 * 1024);
            auto& device = tp.device();
            long const copies = device.copies, launches = device.launches;
            rank_t const me = tp.rank();
            double const sum_ranks = p * (p + 1) / 2.0;
            // Sizes across lanes and slots: 0, 1, p + 1 elements, then 3 and 4 lanes, then 1 again.
            std::size_t const sizes[] = {0, 1, static_cast<std::size_t>(p) + 1, 5000, 8192, 3, 7777};
            long calls = 0;
            for (std::size_t n : sizes) {
                CAPTURE(n);
                std::vector<double> v(n);
                for (std::size_t i = 0; i < n; ++i) v[i] = (me + 1) * 1.0 + static_cast<double>(i % 13);
                chorus::allreduce<chorus::one_shot>(tp, v);
                ++calls;
                CHECK(device.last_lanes == chorus::detail::signal_lanes(n * sizeof(double), p));
                for (std::size_t i = 0; i < n; ++i) REQUIRE(v[i] == sum_ranks + p * static_cast<double>(i % 13));
                // In place and from rank order: MAX, and AVG (the op's finish in the launch).
                std::vector<std::int64_t> w(n);
                for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<std::int64_t>((me * 7 + static_cast<rank_t>(i)) % (p + 2));
                auto expected_max = w;
                for (std::size_t i = 0; i < n; ++i) {
                    std::int64_t m = 0;
                    for (rank_t r = 0; r < p; ++r) m = std::max<std::int64_t>(m, (r * 7 + static_cast<rank_t>(i)) % (p + 2));
                    expected_max[i] = m;
                }
                chorus::allreduce<chorus::one_shot>(tp, std::span(w), chorus::maximum{});
                ++calls;
                CHECK(w == expected_max);
                std::vector<float> a(n, static_cast<float>(2 * me));
                chorus::allreduce<chorus::one_shot>(tp, std::span(a), chorus::avg{});
                ++calls;
                for (float x : a) REQUIRE(x == static_cast<float>(p - 1));
            }
            // The automatic choice takes the launch for a small vector too.
            std::vector<int> small(10, 1);
            chorus::allreduce(tp, small);
            ++calls;
            CHECK(small == std::vector<int>(10, p));
            std::vector<int> blocks_of_four(static_cast<std::size_t>(p) * 4, 1), four(4);
            chorus::reduce_scatter(tp, blocks_of_four, four);
            ++calls;
            CHECK(four == std::vector<int>(4, p));
            // Broadcast, allgather, reduce_scatter and alltoall, across lane partitions too.
            for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{0}, std::size_t{3}}) {
                CAPTURE(n);
                std::vector<double> b(n, me == p - 1 ? 7.5 : -1.0);
                chorus::broadcast(tp, b, p - 1);
                ++calls;
                CHECK(b == std::vector<double>(n, 7.5));
                std::vector<std::int32_t> mine(n), all(n * static_cast<std::size_t>(p));
                for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::int32_t>(me * 100000 + static_cast<rank_t>(i));
                chorus::allgather(tp, mine, all);
                ++calls;
                for (rank_t r = 0; r < p; ++r)
                    for (std::size_t i = 0; i < n; ++i)
                        REQUIRE(all[static_cast<std::size_t>(r) * n + i] == static_cast<std::int32_t>(r * 100000 + static_cast<rank_t>(i)));
                // reduce_scatter (sum; AVG, the op's finish in the launch) and alltoall: p blocks
                // of m elements each, as many bytes in all as the vectors above.
                std::size_t const m = n / static_cast<std::size_t>(p), pm = m * static_cast<std::size_t>(p);
                std::vector<double> blocks(pm), reduced(m);
                for (std::size_t x = 0; x < pm; ++x) blocks[x] = me * 10.0 + static_cast<double>(x / m) + static_cast<double>(x % m % 7);
                chorus::reduce_scatter<chorus::one_shot>(tp, blocks, reduced);
                ++calls;
                for (std::size_t i = 0; i < m; ++i) REQUIRE(reduced[i] == 5.0 * p * (p - 1) + p * (me + static_cast<double>(i % 7)));
                std::vector<float> halves(pm, static_cast<float>(2 * me)), averaged(m);
                chorus::reduce_scatter<chorus::one_shot>(tp, halves, averaged, chorus::avg{});
                ++calls;
                for (float x : averaged) REQUIRE(x == static_cast<float>(p - 1));
                std::vector<std::int32_t> out(pm), in(pm);
                for (std::size_t x = 0; x < pm; ++x)
                    out[x] = static_cast<std::int32_t>(me * 1000 + static_cast<rank_t>(x / m) * 10 + static_cast<rank_t>(x % m % 7));
                chorus::alltoall<chorus::one_shot>(tp, out, in);
                ++calls;
                for (std::size_t x = 0; x < pm; ++x)
                    REQUIRE(in[x] == static_cast<std::int32_t>(static_cast<rank_t>(x / m) * 1000 + me * 10 + static_cast<rank_t>(x % m % 7)));
            }
            CHECK(device.launches - launches == calls);
            CHECK(device.copies == copies);  // each lane copied its share into the slot itself
            // An op that is not trivially copyable cannot be a kernel argument: rounds instead.
            auto const held = std::make_shared<int>(1);
            auto const scaled_sum = [held](int a, int b) { return a + b * *held; };
            static_assert(!std::is_trivially_copyable_v<decltype(scaled_sum)>);
            std::vector<int> ones(7, 1);
            chorus::allreduce<chorus::one_shot>(tp, std::span(ones), scaled_sum);
            CHECK(ones == std::vector<int>(7, p));
            CHECK(device.launches - launches == calls);
            // Beyond the slots: rounds of the direct exchange, not a launch.
            std::vector<double> large(64 * 1024 / sizeof(double) + 1, 1.0);
            chorus::allreduce<chorus::one_shot>(tp, large);
            CHECK(device.launches - launches == calls);
            for (double x : large) REQUIRE(x == p);
        }, 60s);
    }
}

TEST_CASE("staged protocol (host model): signaled launches only where every rank asks for them") {
    auto const config = [](rank_t r) { return chorus::staged_config{256, 3, 1024, 0, r != 1}; };
    staged_runner::run_with(3, config, [&](staged_model& tp) {
        CHECK(tp.signal_bytes() == 0);
        std::vector<int> v(20, tp.rank());
        chorus::allreduce<chorus::one_shot>(tp, v);
        CHECK(v == std::vector<int>(20, 3));
        CHECK(tp.device().launches == 0);
    }, 60s);
}

TEST_CASE("staged protocol (host model): signaled launches of other sizes, or a rank that never comes, fail every rank alike, naming it") {
    auto const config = [](rank_t) { return chorus::staged_config{256, 3, 64 * 1024, 0, true}; };
    // Rank 1 calls with another size, on 1 lane against 3 (so 2 of rank 0's lanes wait for lanes
    // rank 1 never runs: the abort stops them, not the timeout).
    auto const errors = errors_of(3, config, [](staged_model& tp) {
        std::vector<double> v(tp.rank() == 1 ? 4 : 5000, 1.0);
        chorus::allreduce<chorus::one_shot>(tp, v);
    });
    for (auto const& e : errors) {
        CHECK_MESSAGE(e.find("rank 1 called allreduce with 32 bytes, rank 0 allreduce with 40000 bytes") != std::string::npos, e);
        CHECK_MESSAGE(e.find("on the device") != std::string::npos, e);
    }
    // The same for a reduce_scatter, whose shape is its send vector's (p blocks).
    auto const scattered = errors_of(3, config, [](staged_model& tp) {
        std::size_t const n = tp.rank() == 1 ? 1 : 1666;
        std::vector<double> send(3 * n, 1.0), recv(n);
        chorus::reduce_scatter<chorus::one_shot>(tp, send, recv);
    });
    for (auto const& e : scattered) {
        CHECK_MESSAGE(e.find("rank 1 called reduce_scatter with 24 bytes, rank 0 reduce_scatter with 39984 bytes") != std::string::npos, e);
        CHECK_MESSAGE(e.find("on the device") != std::string::npos, e);
    }
    // Rank 0's host fails the group (its thread's device is not the transport's) while the
    // others wait in their launches: the abort word it raises stops them, not their timeout, and
    // every rank says why.
    auto const host_failure = errors_of(3, config, [](staged_model& tp) {
        chorus::barrier(tp);
        if (tp.rank() == 0) tp.device().wrong_device = true;
        std::vector<double> v(100, 1.0);
        chorus::allreduce<chorus::one_shot>(tp, v);
    });
    for (auto const& e : host_failure) {
        CHECK_MESSAGE(e.find("current device is not the transport's") != std::string::npos, e);
        CHECK_MESSAGE(e.find("did not reach") == std::string::npos, e);
    }
    // Rank 2 never launches (nor leaves, until after the others' timeout: 3 s here): ranks 0
    // and 1 wait on the device until then, and both name it.
    auto const missing = errors_of(3, config, [](staged_model& tp) {
        if (tp.rank() == 2) {
            chorus::barrier(tp);  // the others' set-up came
            std::this_thread::sleep_for(4s);
            return;
        }
        chorus::barrier(tp);
        std::vector<double> v(100, 1.0);
        chorus::allreduce<chorus::one_shot>(tp, v);
    }, 3s);
    for (rank_t r : {0, 1}) {
        std::string const& e = missing[static_cast<std::size_t>(r)];
        CHECK_MESSAGE(e.find("rank 2 did not reach allreduce with 800 bytes on the device") != std::string::npos, e);
    }
}

TEST_CASE("staged protocol (host model): ranks that call a collective differently fail alike, on either side of the one_shot limit") {
    auto const slots = [](rank_t) { return chorus::staged_config{256, 3, 64}; };
    auto const allreduce_of = [&](std::size_t n0, std::size_t n1) {
        return errors_of(3, slots, [&](staged_model& tp) {
            std::vector<double> v(tp.rank() == 1 ? n1 : n0, 1.0);
            chorus::allreduce(tp, v);
        });
    };
    conformance::one_shot_mismatches(allreduce_of, 4, 5, 1000);  // 64-byte rounds: 4 and 5 doubles fit
}

TEST_CASE("staged protocol (host model): ranks whose FIFOs or slots differ in size refuse each other, naming the setting") {
    // A rank that computed its peers' layout from other sizes would copy into the wrong place
    // of their memory: no operation runs, every rank says which setting differs.
    auto const errors = errors_of(3, [](rank_t r) { return chorus::staged_config{256, 3, r == 1 ? 128u : 64u}; },
                                  [](staged_model& tp) { chorus::barrier(tp); });
    for (auto const& e : errors) {
        CHECK_MESSAGE(e.find("direct_bytes 128") != std::string::npos, e);
        CHECK_MESSAGE(e.find("must agree") != std::string::npos, e);
    }
}

TEST_CASE("staged protocol (host model): messages of many chunks, unexpected and late, stay whole and in order") {
    // Through the FIFOs alone, then with the messages of 1 KiB or more by rendezvous among them
    // (one tag holds both kinds: the rendezvous must keep its place in the sender's order).
    for (std::size_t const rendezvous : {std::size_t{0}, std::size_t{1024}}) {
        CAPTURE(rendezvous);
        staged_runner::run_with(3, [&](rank_t) { return chorus::staged_config{256, 3, 1024, rendezvous}; }, [&](staged_model& tp) {
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
            CHECK((tp.device().exports == 2 * (p - 1)) == (rendezvous != 0));  // 1028 and 12000 bytes to each peer
            CHECK(testing_support::host_model_device::open_handles.load() > 0);
        }, 20s);
        // Every rank closed the FIFOs it had opened (in its destructor, before the goodbye).
        CHECK(testing_support::host_model_device::open_handles.load() == 0);
    }
}

TEST_CASE("staged protocol (host model): a message of rendezvous_bytes or more is copied once, from the sender's buffer where it lies") {
    using device = testing_support::host_model_device;
    auto const config = [](rank_t) { return chorus::staged_config{256, 3, 1024, 4096}; };
    std::size_t const n = 3001;  // 12004 bytes: 47 chunks through the FIFO
    auto const payload = [](std::size_t k, std::size_t i) { return static_cast<std::uint32_t>(k * 100000 + i); };
    auto const fill = [&](std::span<std::uint32_t> v, std::size_t k) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = payload(k, i);
    };
    auto const right = [&](std::span<std::uint32_t const> v, std::size_t k) {
        for (std::size_t i = 0; i < v.size(); ++i)
            if (v[i] != payload(k, i)) return false;
        return true;
    };
    // A word on the control channel (a tag the engine does not use): orders the ranks' steps
    // without moving anything through the engine.
    auto const signal = [](staged_model& tp, rank_t to) {
        std::uint32_t word = 1;
        chorus::send(tp.control(), to, std::span(&word, 1), 99);
    };
    auto const await = [](staged_model& tp, rank_t from) {
        std::uint32_t word = 0;
        chorus::recv(tp.control(), from, std::span(&word, 1), 99);
    };
    long const open_before = device::open_handles.load();
    staged_runner::run_with(2, config, [&](staged_model& tp) {
        auto& d = tp.device();
        chorus::barrier(tp);  // every FIFO opened: what stays open
        long const fifos = d.open_here;
        std::vector<std::uint32_t> out(n), in(n);
        // 1. The receive posted first: the receiver copies once, into it; the sender copies nothing.
        if (tp.rank() == 0) {
            fill(out, 1);
            await(tp, 1);
            long const copies = d.copies, exports = d.exports;
            chorus::send(tp, 1, std::span<std::uint32_t const>(out), 5);
            CHECK(d.copies == copies);
            CHECK(d.exports == exports + 1);
        } else {
            long const copies = d.copies, opens = d.opens;
            auto r = tp.irecv(0, 5, conformance::bytes(in));
            signal(tp, 0);
            r.wait();
            CHECK(d.copies == copies + 1);
            CHECK(d.opens == opens + 1);
            CHECK(d.open_here == fifos);  // closed once copied
            CHECK(right(in, 1));
        }
        // 2. Before its receive is posted: pulled into staging while the receiver waits for
        // something else, so that the send completes without the receive.
        if (tp.rank() == 0) {
            fill(out, 2);
            chorus::send(tp, 1, std::span<std::uint32_t const>(out), 6);  // returns: rank 1 has not posted tag 6
            std::uint32_t after = 42;
            chorus::send(tp, 1, std::span(&after, 1), 7);
        } else {
            std::uint32_t after = 0;
            chorus::recv(tp, 0, std::span(&after, 1), 7);
            CHECK(after == 42);
            std::ranges::fill(in, 0u);
            chorus::recv(tp, 0, std::span(in), 6);
            CHECK(right(in, 2));
            CHECK(d.open_here == fifos);
        }
        // 3. From memory the device cannot export: through the FIFO, nothing opened.
        if (tp.rank() == 0) {
            fill(out, 3);
            d.refuse_export = true;
            long const copies = d.copies;
            chorus::send(tp, 1, std::span<std::uint32_t const>(out), 8);
            CHECK(d.copies == copies + 47);
            d.refuse_export = false;
        } else {
            long const opens = d.opens;
            chorus::recv(tp, 0, std::span(in), 8);
            CHECK(d.opens == opens);
            CHECK(right(in, 3));
        }
        // 4. From a registered buffer: no export, no open (every peer keeps it open).
        std::vector<std::uint32_t> arena(n + 10);
        auto const reg = chorus::register_buffer(tp, arena);
        CHECK(reg.kept());
        long const kept = d.open_here;
        for (std::size_t k = 4; k < 7; ++k) {
            if (tp.rank() == 0) {
                fill(std::span(arena).subspan(10), k);
                long const exports = d.exports;
                chorus::send(tp, 1, std::span<std::uint32_t const>(arena).subspan(10), 9);
                CHECK(d.exports == exports);
            } else {
                long const opens = d.opens, copies = d.copies;
                chorus::recv(tp, 0, std::span(in), 9);
                CHECK(d.opens == opens);
                CHECK(d.copies == copies + 1);
                CHECK(right(in, k));
            }
        }
        CHECK(d.open_here == kept);
        // A message from the registration still in flight when it ends: the receiver, which
        // closed the allocation, opens it for that copy alone.
        std::optional<staged_model::request> in_flight;
        long const opens_before_release = d.opens;
        if (tp.rank() == 0) {
            fill(std::span(arena).subspan(10), 8);
            in_flight.emplace(tp.isend(1, 12, std::as_bytes(std::span<std::uint32_t const>(arena).subspan(10))));
        }
        chorus::deregister_buffer(tp, reg);
        if (tp.rank() == 0) {
            in_flight->wait();
        } else {
            chorus::recv(tp, 0, std::span(in), 12);
            CHECK(right(in, 8));
            CHECK(d.opens == opens_before_release + 1);
        }
        CHECK(d.open_here == fifos);
        // 5. To itself: through its own FIFO, nothing exported.
        long const exports = d.exports;
        fill(out, 7);
        chorus::sendrecv(tp, tp.rank(), std::span<std::uint32_t const>(out), tp.rank(), std::span(in), 10);
        CHECK(d.exports == exports);
        CHECK(right(in, 7));
    }, 20s);
    CHECK(device::open_handles.load() == open_before);

    // A receive of another size: the receiver fails naming the sender and copies nothing, the
    // sender fails with the group; nothing stays open.
    std::mutex mutex;
    std::vector<std::string> errors(2);
    staged_runner::run_with(2, config, [&](staged_model& tp) {
        std::vector<std::uint32_t> v(tp.rank() == 0 ? n : n - 1);
        try {
            if (tp.rank() == 0) chorus::send(tp, 1, std::span<std::uint32_t const>(v), 5);
            else chorus::recv(tp, 0, std::span(v), 5);
            chorus::barrier(tp);
        } catch (chorus::error const& e) {
            std::lock_guard lock(mutex);
            errors[static_cast<std::size_t>(tp.rank())] = e.what();
        }
    }, 20s);
    CHECK_MESSAGE(errors[1].find("rank 0") != std::string::npos, errors[1]);
    CHECK_MESSAGE(errors[1].find("12004") != std::string::npos, errors[1]);
    CHECK_MESSAGE(!errors[0].empty(), errors[0]);
    CHECK(device::open_handles.load() == open_before);
}

TEST_CASE("staged protocol (host model): a device error or a wrong current device fails the collective on every rank, with its text") {
    enum fault { copy_fails, wrong_device, completion_fails };
    for (bool const one_shot : {false, true}) {
        for (fault const f : {copy_fails, wrong_device, completion_fails}) {
            CAPTURE(one_shot);
            CAPTURE(static_cast<int>(f));
            std::mutex mutex;
            std::vector<std::string> errors(3, "no error");
            staged_runner::run(3, [&](staged_model& tp) {
                if (tp.rank() == 0) {
                    auto& d = tp.device();
                    (f == copy_fails ? d.fail_copies : f == wrong_device ? d.wrong_device : d.fail_completion) = true;
                }
                std::vector<std::uint32_t> v(100, 1);
                try {
                    if (one_shot) chorus::allreduce<chorus::one_shot>(tp, v, chorus::sum{});
                    else chorus::allreduce<chorus::ring>(tp, v, chorus::sum{});
                } catch (chorus::error const& e) {
                    std::lock_guard lock(mutex);
                    errors[static_cast<std::size_t>(tp.rank())] = e.what();
                }
            }, 20s);
            char const* const want = f == copy_fails     ? "host model: copy failed (injected)"
                                     : f == wrong_device ? "current device is not the transport's"
                                                         : "host model: queued work failed (injected)";
            for (auto const& e : errors) {
                CHECK_MESSAGE(e.find(want) != std::string::npos, e);
                CHECK_MESSAGE(e.find("timed out") == std::string::npos, e);
            }
        }
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
