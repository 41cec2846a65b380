// SPDX-License-Identifier: MIT
// Bad input gets a clear error on every rank, never a hang or silent corruption.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/conformance.hpp"

using chorus::rank_t;
using conformance::outcomes;
using namespace std::chrono_literals;

namespace {

// Runs fn on p ranks with a short timeout, recording what each rank threw.
template <class Fn>
outcomes run_recording(rank_t p, Fn fn, std::chrono::milliseconds timeout = 2s) {
    outcomes seen(p);
    chorus::run_ranks(p, [&](auto& tp) { seen.record(tp.rank(), [&] { fn(tp); }); }, {.timeout = timeout});
    return seen;
}

bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

void check_all_threw(outcomes const& seen, rank_t p) {
    for (rank_t r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(seen[r].threw);
    }
}

} // namespace

TEST_CASE("a root out of range is rejected on every rank") {
    for (rank_t bad : {-1, 4}) {
        auto const seen = run_recording(4, [&](auto& tp) {
            std::vector<int> v(3);
            chorus::broadcast(tp, v, bad);
        });
        for (rank_t r = 0; r < 4; ++r) {
            CHECK(seen[r].code == chorus::errc::invalid_argument);
            CHECK(contains(seen[r].what, "root " + std::to_string(bad)));
        }
    }
    auto const seen = run_recording(3, [](auto& tp) {
        std::vector<int> v(3), out(3);
        chorus::reduce(tp, v, out, chorus::sum{}, 3);
    });
    for (rank_t r = 0; r < 3; ++r) CHECK(seen[r].code == chorus::errc::invalid_argument);
}

TEST_CASE("buffers of the wrong size are rejected with what was expected") {
    SUBCASE("gather: root's receive buffer too small; the senders learn at their next collective") {
        auto const seen = run_recording(4, [](auto& tp) {
            std::vector<int> send(2), recv(tp.rank() == 0 ? 7 : 0);
            chorus::gather(tp, send, recv, 0);
            chorus::barrier(tp);
        });
        check_all_threw(seen, 4);
        CHECK(seen[0].code == chorus::errc::invalid_argument);
        CHECK(contains(seen[0].what, "4 * 2"));
        for (rank_t r = 1; r < 4; ++r) {
            CHECK(seen[r].code == chorus::errc::peer_failed);
            CHECK(seen[r].peer == 0);
        }
    }
    SUBCASE("allgather, alltoall, reduce_scatter, scatter") {
        auto const seen = run_recording(3, [](auto& tp) {
            std::vector<float> send(2), recv(5);
            chorus::allgather(tp, send, recv);
        });
        for (rank_t r = 0; r < 3; ++r) CHECK(seen[r].code == chorus::errc::invalid_argument);
        auto const seen2 = run_recording(3, [](auto& tp) {
            std::vector<float> send(7), recv(7);
            chorus::alltoall(tp, send, recv);
        });
        for (rank_t r = 0; r < 3; ++r) CHECK(seen2[r].code == chorus::errc::invalid_argument);
        auto const seen3 = run_recording(3, [](auto& tp) {
            std::vector<float> send(7), recv(2);
            chorus::reduce_scatter(tp, send, recv);
        });
        for (rank_t r = 0; r < 3; ++r) CHECK(seen3[r].code == chorus::errc::invalid_argument);
        auto const seen4 = run_recording(3, [](auto& tp) {
            std::vector<float> send(tp.rank() == 1 ? 5 : 0), recv(2);
            chorus::scatter(tp, send, recv, 1);
        });
        check_all_threw(seen4, 3);
        CHECK(seen4[1].code == chorus::errc::invalid_argument);
    }
}

TEST_CASE("alltoallv: counts that do not add up are rejected") {
    SUBCASE("counts summing to less than the buffer") {
        auto const seen = run_recording(3, [](auto& tp) {
            std::vector<int> send(10), recv(3);
            std::vector<int> counts{1, 1, 1};
            chorus::alltoallv(tp, send, counts, recv, counts);
        });
        for (rank_t r = 0; r < 3; ++r) {
            CHECK(seen[r].code == chorus::errc::invalid_argument);
            CHECK(contains(seen[r].what, "sum to 3"));
        }
    }
    SUBCASE("a count vector of the wrong length, a negative count, an overrunning displacement") {
        auto const a = run_recording(3, [](auto& tp) {
            std::vector<int> send(2), recv(2), counts{1, 1};
            chorus::alltoallv(tp, send, counts, recv, counts);
        });
        CHECK(contains(a[0].what, "one per rank"));
        auto const b = run_recording(2, [](auto& tp) {
            std::vector<int> send(2), recv(2), counts{2, -1};
            chorus::alltoallv(tp, send, counts, recv, counts);
        });
        CHECK(contains(b[0].what, "negative"));
        auto const c = run_recording(2, [](auto& tp) {
            std::vector<int> send(2), recv(2), counts{1, 1}, displs{0, 2};
            chorus::alltoallv(tp, send, counts, displs, recv, counts, displs);
        });
        CHECK(contains(c[0].what, "overruns"));
        auto const d = run_recording(2, [](auto& tp) {
            std::vector<int> send(2), recv(3), counts{2, 2}, sd{0, 0}, rd{0, 1};
            chorus::alltoallv(tp, send, counts, sd, recv, counts, rd);
        });
        CHECK(contains(d[0].what, "overlap"));
    }
    SUBCASE("ranks that disagree about a count: the receiver names the sender") {
        auto const seen = run_recording(2, [](auto& tp) {
            // Rank 0 sends 2 elements to rank 1, but rank 1 expects 3.
            std::vector<int> sc = tp.rank() == 0 ? std::vector<int>{1, 2} : std::vector<int>{1, 1};
            std::vector<int> rc = tp.rank() == 0 ? std::vector<int>{1, 1} : std::vector<int>{3, 1};
            std::vector<int> send(3), recv(static_cast<std::size_t>(rc[0] + rc[1]));
            send.resize(static_cast<std::size_t>(sc[0] + sc[1]));
            chorus::alltoallv(tp, send, sc, recv, rc);
            chorus::barrier(tp);  // rank 0's sends completed eagerly; it learns here
        });
        check_all_threw(seen, 2);
        CHECK(seen[1].code == chorus::errc::size_mismatch);
        CHECK(seen[1].peer == 0);
    }
}

TEST_CASE("mismatched sizes across ranks are an error on every rank, never a hang") {
    for (rank_t p : {2, 3, 4, 7}) {
        CAPTURE(p);
        auto const start = std::chrono::steady_clock::now();
        auto const seen = run_recording(p, [](auto& tp) {
            std::vector<double> v(tp.rank() == 1 ? 101 : 100, 1.0);
            chorus::allreduce(tp, v);
            chorus::barrier(tp);
        });
        check_all_threw(seen, p);
        bool mismatch_seen = false;
        for (rank_t r = 0; r < p; ++r) mismatch_seen = mismatch_seen || seen[r].code == chorus::errc::size_mismatch;
        CHECK(mismatch_seen);
        CHECK(std::chrono::steady_clock::now() - start < 1500ms);  // well before the 2 s timeout
    }
}

TEST_CASE("ranks in different collectives get a collective mismatch naming both") {
    auto const seen = run_recording(3, [](auto& tp) {
        std::vector<int> v(4, 1);
        // Rank 0's broadcast messages reach ranks waiting in allreduce #0.
        if (tp.rank() == 0) chorus::broadcast(tp, v, 0);
        else chorus::allreduce(tp, v);
        chorus::barrier(tp);
    });
    check_all_threw(seen, 3);
    bool named = false;
    for (rank_t r = 0; r < 3; ++r)
        named = named || (seen[r].code == chorus::errc::tag_mismatch && contains(seen[r].what, "broadcast #0") &&
                          contains(seen[r].what, "allreduce #0"));
    CHECK(named);
}

TEST_CASE("a rank that never arrives makes the others time out naming it") {
    auto const start = std::chrono::steady_clock::now();
    auto const seen = run_recording(
        4,
        [](auto& tp) {
            if (tp.rank() == 3) return;  // never joins
            std::vector<float> v(8, 1.0f);
            chorus::allreduce(tp, v);
        },
        300ms);
    auto const took = std::chrono::steady_clock::now() - start;
    CHECK_FALSE(seen[3].threw);
    for (rank_t r = 0; r < 3; ++r) {
        CAPTURE(r);
        CHECK(seen[r].threw);
        CHECK((seen[r].code == chorus::errc::timeout || seen[r].code == chorus::errc::peer_failed));
        CHECK(contains(seen[r].what, "have not reached it: 3"));
    }
    CHECK(took < 3s);
}

TEST_CASE("point-to-point: bad peer, reserved tag, size mismatch") {
    auto const seen = run_recording(2, [](auto& tp) {
        std::vector<int> v(1);
        chorus::send(tp, 2, v);
    });
    CHECK(seen[0].code == chorus::errc::invalid_argument);
    CHECK(contains(seen[0].what, "peer 2"));
    auto const reserved = run_recording(2, [](auto& tp) {
        std::vector<int> v(1);
        chorus::send(tp, 1 - tp.rank(), v, chorus::collective_tag_bit | 5);
    });
    CHECK(contains(reserved[0].what, "reserved"));
}

TEST_CASE("CHORUS_ALGO and CHORUS_DEBUG are read on every call: set, changed, unset, other variables coming and going") {
    using chorus::detail::debug_enabled;
    using chorus::detail::env_algorithm;
    ::unsetenv("CHORUS_ALGO");
    ::unsetenv("CHORUS_DEBUG");
    CHECK(env_algorithm("allreduce").empty());
    CHECK(!debug_enabled());
    ::setenv("CHORUS_ALGO", "allreduce:tree", 1);  // added at the end
    CHECK(env_algorithm("allreduce") == "tree");
    ::setenv("CHORUS_ALGO", "allreduce:ring", 1);  // its entry replaced
    CHECK(env_algorithm("allreduce") == "ring");
    ::setenv("CHORUS_ERRORS_TEST_OTHER", "1", 1);  // another one after it
    CHECK(env_algorithm("allreduce") == "ring");
    ::unsetenv("CHORUS_ALGO");  // the entries behind it shift
    CHECK(env_algorithm("allreduce").empty());
    ::setenv("CHORUS_DEBUG", "1", 1);
    CHECK(debug_enabled());
    ::unsetenv("CHORUS_ERRORS_TEST_OTHER");  // the last entry changes
    CHECK(env_algorithm("allreduce").empty());
    CHECK(debug_enabled());
    ::setenv("CHORUS_DEBUG", "0", 1);
    CHECK(!debug_enabled());
    ::setenv("CHORUS_ALGO", "broadcast:linear", 1);
    CHECK(env_algorithm("broadcast") == "linear");
    ::unsetenv("CHORUS_DEBUG");
    CHECK(!debug_enabled());
    CHECK(env_algorithm("broadcast") == "linear");
    ::unsetenv("CHORUS_ALGO");
    CHECK(env_algorithm("broadcast").empty());
    // Two entries gone and two added: glibc may keep the array where it was, of the same
    // length, with the same last entry; the variable is there all the same.
    ::setenv("CHORUS_ERRORS_TEST_A", "1", 1);
    ::setenv("CHORUS_ERRORS_TEST_L", "v", 1);
    CHECK(env_algorithm("allreduce").empty());
    ::unsetenv("CHORUS_ERRORS_TEST_A");
    ::unsetenv("CHORUS_ERRORS_TEST_L");
    ::setenv("CHORUS_ALGO", "allreduce:ring", 1);
    ::setenv("CHORUS_ERRORS_TEST_L", "v", 1);
    CHECK(env_algorithm("allreduce") == "ring");
    ::unsetenv("CHORUS_ALGO");
    ::unsetenv("CHORUS_ERRORS_TEST_L");
    CHECK(env_algorithm("allreduce").empty());
}

TEST_CASE("CHORUS_ALGO overrides the automatic choice and rejects unknown names") {
    ::setenv("CHORUS_ALGO", "allreduce:tree,broadcast:linear", 1);
    chorus::run_ranks(3, [](auto& tp) {
        std::vector<int> v(5, tp.rank());
        chorus::allreduce(tp, v);
        CHECK(v == std::vector<int>(5, 0 + 1 + 2));
        chorus::broadcast(tp, v, 2);
    });
    CHECK(chorus::detail::env_algorithm("allreduce") == "tree");
    CHECK(chorus::detail::env_algorithm("broadcast") == "linear");
    CHECK(chorus::detail::env_algorithm("gather").empty());
    ::setenv("CHORUS_ALGO", "allreduce:rng", 1);
    auto const seen = run_recording(2, [](auto& tp) {
        std::vector<int> v(5);
        chorus::allreduce(tp, v);
    });
    ::unsetenv("CHORUS_ALGO");
    CHECK(seen[0].code == chorus::errc::invalid_argument);
    CHECK(contains(seen[0].what, "'rng'"));
    // A ring for a non-commutative op is not an option the override can force.
    ::setenv("CHORUS_ALGO", "allreduce:ring", 1);
    auto const ordered = run_recording(2, [](auto& tp) {
        std::vector<int> v(5);
        chorus::allreduce(tp, v, [](int a, int b) { return a * 10 + b; });
    });
    ::unsetenv("CHORUS_ALGO");
    CHECK(contains(ordered[0].what, "not one of its algorithms"));
    // Collectives with a single schedule accept its name and reject others.
    ::setenv("CHORUS_ALGO", " gather : linear , alltoall:tree", 1);
    auto const single = run_recording(2, [](auto& tp) {
        std::vector<int> mine(1, tp.rank()), all(tp.rank() == 0 ? 2 : 0);
        chorus::gather(tp, mine, all, 0);
        std::vector<int> send(2), recv(2);
        chorus::alltoall(tp, send, recv);
    });
    ::unsetenv("CHORUS_ALGO");
    // Rank 1 may reject it while rank 0 still waits in gather; rank 0 then sees peer_failed
    // carrying rank 1's message.
    for (rank_t r = 0; r < 2; ++r) CHECK_MESSAGE(contains(single[r].what, "alltoall: CHORUS_ALGO names 'tree'"), single[r].what);
}

TEST_CASE("automatic selection follows message size and op traits") {
    using chorus::detail::choose_allreduce;
    CHECK(choose_allreduce(4, 64, true).algorithm == chorus::recursive_doubling::name);
    CHECK(choose_allreduce(4, 256 * 1024, true).algorithm == chorus::rabenseifner::name);
    CHECK(choose_allreduce(4, 64 << 20, true).algorithm == chorus::ring::name);
    CHECK(choose_allreduce(4, 64 << 20, false).algorithm == chorus::rabenseifner::name);
}

TEST_CASE("v-collectives: counts that do not add up are a clear invalid_argument") {
    SUBCASE("allgatherv: counts of the wrong length, a negative count, a sum that misses the buffer") {
        for (auto const& [counts, part] : std::vector<std::pair<std::vector<int>, std::string>>{
                 {{1, 1}, "2 entries, expected one per rank (3)"},
                 {{1, -1, 1}, "negative entry -1"},
                 {{1, 1, 2}, "recv_counts sum to 4 but the receive buffer holds 3"}}) {
            auto const seen = run_recording(3, [&](auto& tp) {
                std::vector<int> send(1), recv(3);
                chorus::allgatherv(tp, send, recv, counts);
            });
            for (rank_t r = 0; r < 3; ++r) {
                CAPTURE(r);
                CHECK(seen[r].code == chorus::errc::invalid_argument);
                CHECK(contains(seen[r].what, part));
            }
        }
    }
    SUBCASE("gatherv: a rank sends more than the root's count for it: size mismatch naming it") {
        auto const seen = run_recording(3, [](auto& tp) {
            std::vector<int> send(tp.rank() == 2 ? 3 : 1), recv(tp.rank() == 0 ? 3 : 0);
            chorus::gatherv(tp, send, recv, std::vector<int>{1, 1, 1}, 0);
        });
        CHECK(seen[0].code == chorus::errc::size_mismatch);
        CHECK(seen[0].peer == 2);
    }
    SUBCASE("reduce_scatter with counts: this rank's count differs from its receive buffer") {
        auto const seen = run_recording(2, [](auto& tp) {
            std::vector<double> send(5), recv(tp.rank() == 1 ? 2 : 3);
            chorus::reduce_scatter(tp, send, recv, std::vector<int>{3, 2});
            std::vector<double> wrong(2);
            chorus::reduce_scatter(tp, send, wrong, std::vector<int>{3, 2});  // rank 0: 3 != 2
        });
        CHECK(seen[0].code == chorus::errc::invalid_argument);
        CHECK(contains(seen[0].what, "recv_counts[0] is 3 but the receive buffer holds 2"));
        CHECK(seen[1].threw);
    }
    SUBCASE("scan: buffers of different sizes") {
        auto const seen = run_recording(2, [](auto& tp) {
            std::vector<int> send(4), recv(3);
            chorus::scan(tp, send, recv);
        });
        for (rank_t r = 0; r < 2; ++r) CHECK(contains(seen[r].what, "scan: the receive buffer holds 3 elements"));
    }
}

TEST_CASE("sub-groups: bad arguments, mismatched lists, tags too large") {
    SUBCASE("group: a rank out of range or listed twice fails every rank") {
        for (auto const& [ranks, part] : std::vector<std::pair<std::vector<int>, std::string>>{
                 {{0, 4}, "rank 4 is out of range"}, {{1, 1}, "rank 1 is listed twice"}}) {
            auto const seen = run_recording(4, [&](auto& tp) { (void)chorus::group(tp, ranks); });
            for (rank_t r = 0; r < 4; ++r) {
                CAPTURE(r);
                CHECK(seen[r].code == chorus::errc::invalid_argument);
                CHECK(contains(seen[r].what, part));
            }
        }
    }
    SUBCASE("group: ranks that pass different lists all throw, and the parent stays usable") {
        auto const seen = run_recording(3, [](auto& tp) {
            std::vector<int> ranks{0, 1};
            if (tp.rank() == 2) ranks = {0, 2};
            try {
                (void)chorus::group(tp, ranks);
            } catch (chorus::invalid_argument const&) {
                std::vector<int> one{1};
                chorus::allreduce(tp, one);  // the parent still works
                if (one[0] == 3) throw;
            }
        });
        for (rank_t r = 0; r < 3; ++r) {
            CAPTURE(r);
            CHECK(seen[r].code == chorus::errc::invalid_argument);
            CHECK(contains(seen[r].what, "rank 2 passed another list of ranks than rank 0"));
        }
    }
    SUBCASE("split: a color below -1; a user tag of 2^36 in a group") {
        auto const seen = run_recording(2, [](auto& tp) { (void)chorus::split(tp, tp.rank() == 1 ? -5 : 0); });
        CHECK(seen[1].code == chorus::errc::invalid_argument);
        CHECK(contains(seen[1].what, "color -5"));
        CHECK(seen[0].threw);
        auto const seen2 = run_recording(2, [](auto& tp) {
            auto g = chorus::split(tp, 0);
            std::vector<int> v(1);
            (void)g->isend(1 - g->rank(), chorus::tag_t{1} << 36, std::as_bytes(std::span(v)));
        });
        for (rank_t r = 0; r < 2; ++r) CHECK(contains(seen2[r].what, "too large for a sub-group"));
    }
    SUBCASE("a group's mismatched collectives are named with the group") {
        auto const seen = run_recording(2, [](auto& tp) {
            auto g = chorus::split(tp, 0);
            std::vector<int> v(4);
            if (g->rank() == 0) chorus::allreduce(*g, v);
            else chorus::broadcast(*g, v, 0);
        });
        bool named = false;
        for (rank_t r = 0; r < 2; ++r) named = named || contains(seen[r].what, "#0 of group");
        CHECK(named);
    }
}

TEST_CASE("nonblocking collectives: failures reach wait(), an abandoned one fails the group") {
    SUBCASE("bad arguments throw from wait() on the rank that passed them; its peers fail too") {
        auto const seen = run_recording(3, [](auto& tp) {
            std::vector<int> send(2), recv(tp.rank() == 1 ? 5 : 6);
            auto r = chorus::iallgather(tp, send, recv);
            r.wait();
        });
        CHECK(seen[1].code == chorus::errc::invalid_argument);
        CHECK(seen[0].threw);
        CHECK(seen[2].threw);
    }
    SUBCASE("a request destroyed before it completed aborts the group, naming the collective") {
        auto const seen = run_recording(2, [](auto& tp) {
            std::vector<int> v(8, 1);
            if (tp.rank() == 0) {
                auto r = chorus::iallreduce(tp, v);  // rank 1 never joins: destroyed pending
            } else {
                std::vector<int> w(1);
                chorus::recv(tp, 0, w);  // fails once rank 0 aborted
            }
        });
        CHECK(seen[1].code == chorus::errc::peer_failed);
        CHECK(contains(seen[1].what, "abandoned a pending iallreduce #0"));
    }
    SUBCASE("a peer that never joins: wait() times out, naming it") {
        auto const seen = run_recording(
            2,
            [](auto& tp) {
                std::vector<int> v(8, 1);
                if (tp.rank() == 0) chorus::iallreduce(tp, v).wait();
            },
            300ms);
        CHECK(seen[0].threw);
        CHECK((seen[0].code == chorus::errc::timeout || seen[0].code == chorus::errc::peer_failed));
    }
}
