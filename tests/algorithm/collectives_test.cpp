// SPDX-License-Identifier: MIT
// Every collective x every algorithm x ranks {1,2,3,4,5,7,8} x sizes {0, 1, p-1, p+1, 4099}
// x every op x int/float/double, checked against the closed forms of support/oracle.hpp.
// The checks live in support/collective_matrix.hpp (shared with the multi-process tests);
// one run_ranks per (collective, rank count): the ranks then run the whole case list in the
// same order, which also exercises the collective tag sequence.

#include "../support/archetypes.hpp"
#include "../support/collective_matrix.hpp"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

using namespace oracle;
using chorus::rank_t;

namespace {

// Runs `body(tp, failures)` on each rank count of `counts` and fails the test case with the
// report; on_all_rank_counts: on every rank count of the matrix.
template <class Body>
void on_rank_counts(std::span<rank_t const> counts, Body body) {
    for (rank_t p : counts) {
        failures f;
        chorus::run_ranks(p, [&](auto& tp) { body(tp, f); });
        INFO("p = " << p);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

template <class Body>
void on_all_rank_counts(Body body) {
    on_rank_counts(rank_counts, body);
}

// A transport with the semantics the performance work targets (TCP with progress on the
// caller's thread, a rendezvous protocol): a send completes only once the receiver posted the
// matching receive, and the bytes move, read from the sender's buffer straight into the
// receiver's, only while the sending rank is inside wait() or test() of one of its requests,
// and then only for a random half of its matched sends per call, so sends stay pending for a
// while. Loopback's eager copies hide two classes of bugs that this exposes: a schedule that
// writes a buffer whose send has not completed (the receiver then gets the new bytes: a
// wrong result), and one that needs a send to progress while its rank waits for nothing (a
// timeout).
class rendezvous_world {
public:
    struct op {
        rank_t src = 0, dst = 0;
        chorus::tag_t tag = 0;
        std::span<std::byte const> out;  // a send's bytes
        std::span<std::byte> in;         // a receive's buffer
        std::shared_ptr<op> partner;     // a send's matched receive
        bool is_send = false;
        bool done = false;
        std::string error;
    };

    explicit rendezvous_world(rank_t p, unsigned seed)
        : unmatched_(static_cast<std::size_t>(p)), matched_(static_cast<std::size_t>(p)), random_(seed) {
        for (rank_t r = 0; r < p; ++r) sequences_.push_back(0);
    }
    rank_t size() const noexcept { return static_cast<rank_t>(unmatched_.size()); }

    std::shared_ptr<op> post_send(rank_t src, rank_t dst, chorus::tag_t tag, std::span<std::byte const> out) {
        std::lock_guard lock(mutex_);
        throw_if_failed(src);
        auto s = std::make_shared<op>(op{src, dst, tag, out, {}, nullptr, true, false, {}});
        auto& box = unmatched_[static_cast<std::size_t>(dst)];
        auto it = std::find_if(box.recvs.begin(), box.recvs.end(), [&](auto const& r) { return r->src == src && r->tag == tag; });
        if (it == box.recvs.end()) {
            box.sends.push_back(s);
        } else {
            s->partner = *it;
            box.recvs.erase(it);
            matched_[static_cast<std::size_t>(src)].push_back(s);
        }
        return s;
    }

    std::shared_ptr<op> post_recv(rank_t me, rank_t src, chorus::tag_t tag, std::span<std::byte> in) {
        std::lock_guard lock(mutex_);
        throw_if_failed(me);
        auto r = std::make_shared<op>(op{src, me, tag, {}, in, nullptr, false, false, {}});
        auto& box = unmatched_[static_cast<std::size_t>(me)];
        auto it = std::find_if(box.sends.begin(), box.sends.end(), [&](auto const& s) { return s->src == src && s->tag == tag; });
        if (it == box.sends.end()) {
            box.recvs.push_back(r);
        } else {
            (*it)->partner = r;
            matched_[static_cast<std::size_t>(src)].push_back(*it);
            box.sends.erase(it);
            ready_.notify_all();  // the sender may be waiting: it moves the bytes
        }
        return r;
    }

    void wait(rank_t me, std::shared_ptr<op> const& o) {
        std::unique_lock lock(mutex_);
        auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (;;) {
            throw_if_failed(me);
            progress(me);
            if (o->done) return check(me, *o);
            // Sends held back by progress() need another call, without any notification.
            auto const retry = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::microseconds(200));
            if (ready_.wait_until(lock, retry) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline) {
                fail("rank " + std::to_string(me) + " timed out waiting for " +
                     (o->is_send ? "its send to rank " + std::to_string(o->dst)
                                 : "its receive from rank " + std::to_string(o->src)));
                throw_if_failed(me);
            }
        }
    }

    bool test(rank_t me, std::shared_ptr<op> const& o) {
        std::lock_guard lock(mutex_);
        throw_if_failed(me);
        progress(me);
        if (o->done) check(me, *o);
        return o->done;
    }

    void cancel(rank_t me, std::shared_ptr<op> const& o) noexcept {
        std::lock_guard lock(mutex_);
        if (!o->done) fail("rank " + std::to_string(me) + " destroyed a pending request");
    }

    void fail(std::string what) noexcept {
        if (failure_.empty()) failure_ = std::move(what);
        ready_.notify_all();
    }
    void abort(rank_t me, char const* reason) noexcept {
        std::lock_guard lock(mutex_);
        fail("rank " + std::to_string(me) + " aborted: " + reason);
    }
    std::uint64_t next_sequence(rank_t me) {
        std::lock_guard lock(mutex_);
        return sequences_[static_cast<std::size_t>(me)]++;
    }

private:
    struct mailbox {
        std::deque<std::shared_ptr<op>> sends, recvs;  // unmatched, in posting order (FIFO matching)
    };

    // The calling rank moves the bytes of its matched sends, its only chance to progress;
    // a random half of them waits for a later call.
    void progress(rank_t me) {
        auto& mine = matched_[static_cast<std::size_t>(me)];
        auto const now = std::stable_partition(mine.begin(), mine.end(), [&](auto const&) { return random_() % 2 == 0; });
        if (now == mine.end()) return;
        for (auto it = now; it != mine.end(); ++it) {
            op& sent = **it;
            op& r = *sent.partner;
            if (sent.out.size() != r.in.size())
                sent.error = r.error = "size mismatch from rank " + std::to_string(sent.src);
            else if (!sent.out.empty())
                std::memcpy(r.in.data(), sent.out.data(), sent.out.size());
            sent.done = r.done = true;
        }
        mine.erase(now, mine.end());
        ready_.notify_all();
    }
    void check(rank_t, op const& o) {
        if (!o.error.empty()) {
            fail(o.error);
            throw chorus::transport_error(chorus::errc::size_mismatch, o.src, o.error);
        }
    }
    void throw_if_failed(rank_t me) const {
        if (!failure_.empty()) throw chorus::transport_error(chorus::errc::peer_failed, me, failure_);
    }

    std::mutex mutex_;
    std::condition_variable ready_;
    std::vector<mailbox> unmatched_;                      // per receiving rank
    std::vector<std::vector<std::shared_ptr<op>>> matched_;  // per sending rank: bytes still to move
    std::vector<std::uint64_t> sequences_;
    std::minstd_rand random_;
    std::string failure_;
};

class rendezvous_transport {
public:
    using memory_space = chorus::host_memory;
    class request {
    public:
        request(rendezvous_world* world, rank_t me, std::shared_ptr<rendezvous_world::op> o)
            : world_(world), me_(me), op_(std::move(o)) {}
        request(request&& other) noexcept
            : world_(other.world_), me_(other.me_), op_(std::move(other.op_)) {}
        request& operator=(request&& other) noexcept {
            if (this != &other) {
                reset();
                world_ = other.world_;
                me_ = other.me_;
                op_ = std::move(other.op_);
            }
            return *this;
        }
        request(request const&) = delete;
        request& operator=(request const&) = delete;
        ~request() { reset(); }
        void wait() {
            if (!op_) return;
            world_->wait(me_, op_);
            op_.reset();
        }
        bool test() {
            if (!op_) return true;
            if (!world_->test(me_, op_)) return false;
            op_.reset();
            return true;
        }

    private:
        void reset() noexcept {
            if (op_) world_->cancel(me_, op_);
            op_.reset();
        }
        rendezvous_world* world_;
        rank_t me_;
        std::shared_ptr<rendezvous_world::op> op_;
    };

    rendezvous_transport(rendezvous_world& world, rank_t rank) : world_(&world), rank_(rank) {}
    rank_t rank() const noexcept { return rank_; }
    rank_t size() const noexcept { return world_->size(); }
    request isend(rank_t peer, chorus::tag_t tag, std::span<std::byte const> bytes) {
        return {world_, rank_, world_->post_send(rank_, peer, tag, bytes)};
    }
    request irecv(rank_t peer, chorus::tag_t tag, std::span<std::byte> bytes) {
        return {world_, rank_, world_->post_recv(rank_, peer, tag, bytes)};
    }
    std::uint64_t next_sequence() { return world_->next_sequence(rank_); }
    void abort(char const* reason) noexcept { world_->abort(rank_, reason); }

private:
    rendezvous_world* world_;
    rank_t rank_;
};
static_assert(chorus::transport<rendezvous_transport>);

template <class Body>
void on_rendezvous_ranks(Body body) {
    for (rank_t p : rank_counts) {
        failures f;
        rendezvous_world world(p, static_cast<unsigned>(p) * 7919u);
        std::vector<std::thread> threads;
        for (rank_t r = 0; r < p; ++r)
            threads.emplace_back([&, r] {
                rendezvous_transport tp(world, r);
                try {
                    body(tp, f);
                } catch (std::exception const& e) {
                    f.add("rank " + std::to_string(r) + " threw: " + e.what());
                    tp.abort(e.what());
                }
            });
        for (auto& t : threads) t.join();
        INFO("p = " << p);
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

// The schedules that keep several requests in flight, over the rendezvous transport: one
// element type and op each (every instantiation costs compile time; the matrix covers the rest).
void in_flight_schedules(rendezvous_transport& tp, failures& f) {
    rank_t const p = tp.size();
    rank_t const me = tp.rank();
    auto const up = static_cast<std::size_t>(p);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, up + 1, up * 11 + 3, std::size_t{4099}}) {
        struct pipeline {
            std::size_t segment, window;
        };
        // Tiny segments on the small sizes only: every message costs a thread handoff here.
        bool const small = n < 1000;
        for (pipeline pl : {pipeline{small ? 1u : 64u, 1}, pipeline{small ? 3u : 96u, 2}, pipeline{small ? 2u : 50u, 4},
                            pipeline{small ? 2u : 128u, 64}, pipeline{1000000, 4}, pipeline{1000000, 64}}) {
            std::vector<double> v(n);
            for (std::size_t i = 0; i < n; ++i) v[i] = value<double>(op_kind::avg, me, i);
            chorus::detail::ring_allreduce_segmented(tp, std::span<double>(v), chorus::avg{}, pl.segment, pl.window);
            compare(f, checks::label("allreduce", "ring", p, n, "avg double segment=") + std::to_string(pl.segment) +
                           " window=" + std::to_string(pl.window), v,
                    [&](std::size_t i) { return expected<double>(op_kind::avg, p, i); });
        }
        for (rank_t root : checks::roots(p)) {
            std::vector<int> v(n, -1);
            if (me == root)
                for (std::size_t i = 0; i < n; ++i) v[i] = checks::payload<int>(root, i);
            chorus::scatter_allgather_broadcast(tp, std::span<int>(v), root);
            compare(f, checks::label("broadcast", "scatter_allgather", p, n, "root=") + std::to_string(root), v,
                    [&](std::size_t i) { return checks::payload<int>(root, i); });
        }
        std::vector<int> mine(n), all(up * n, -1);
        for (std::size_t i = 0; i < n; ++i) mine[i] = checks::payload<int>(me, i);
        auto const gathered = [&](std::size_t i) { return checks::payload<int>(static_cast<rank_t>(i / n), i % n); };
        chorus::ring_allgather(tp, std::span<int const>(mine), std::span<int>(all));
        compare(f, checks::label("allgather", "ring", p, n), all, gathered);
        std::fill(all.begin(), all.end(), -1);
        chorus::bruck_allgather(tp, std::span<int const>(mine), std::span<int>(all));
        compare(f, checks::label("allgather", "bruck", p, n), all, gathered);
        std::vector<int> send(up * n), recv(up * n, -1);
        for (std::size_t x = 0; x < up * n; ++x) send[x] = static_cast<int>((me * 100 + static_cast<int>(x / n)) * 10000 + static_cast<int>(x % n));
        auto const transposed = [&](std::size_t x) {
            return static_cast<int>((static_cast<int>(x / n) * 100 + me) * 10000 + static_cast<int>(x % n));
        };
        chorus::pairwise_alltoall(tp, std::span<int const>(send), std::span<int>(recv));
        compare(f, checks::label("alltoall", "pairwise", p, n), recv, transposed);
        std::fill(recv.begin(), recv.end(), -1);
        chorus::bruck_alltoall(tp, std::span<int const>(send), std::span<int>(recv));
        compare(f, checks::label("alltoall", "bruck", p, n), recv, transposed);
        // Nonblocking: their waits hand control back while a send waits for this rank's progress.
        std::vector<double> a(n), b(n);
        for (std::size_t i = 0; i < n; ++i) a[i] = b[i] = value<double>(op_kind::sum, me, i);
        auto first = chorus::iallreduce<chorus::ring>(tp, a);
        auto second = chorus::iallreduce<chorus::rabenseifner>(tp, b);
        std::fill(recv.begin(), recv.end(), -1);
        auto third = chorus::ialltoall(tp, send, recv);
        third.wait();
        second.wait();
        first.wait();
        auto const sum = [&](std::size_t i) { return expected<double>(op_kind::sum, p, i); };
        compare(f, checks::label("iallreduce", "ring", p, n), a, sum);
        compare(f, checks::label("iallreduce", "rabenseifner", p, n), b, sum);
        compare(f, checks::label("ialltoall", "automatic", p, n), recv, transposed);
    }
    // The v-collectives and scans, whose receives are all posted at once.
    checks::gather_scatter_v(tp, f);
    checks::scans(tp, f);
}

}  // namespace

// Every algorithm instantiates over the archetypes: they use nothing the concepts lack.
template <class... Fns>
constexpr bool instantiated(Fns...) { return true; }
using arch = archetypes::transport;
using aop = archetypes::reduce_op;
using csum = chorus::sum;
static_assert(instantiated(&chorus::dissemination_barrier<arch>, &chorus::linear_broadcast<arch, float>,
                           static_cast<void (*)(arch&, std::span<float>, rank_t)>(&chorus::tree_broadcast<arch, float>),
                           &chorus::tree_broadcast<arch, archetypes::tree_topology, float>,
                           &chorus::linear_scatter<arch, float>, &chorus::linear_gather<arch, float>,
                           &chorus::ring_allgather<arch, float>,
                           static_cast<void (*)(arch&, std::span<float const>, std::span<float>, aop, rank_t)>(
                               &chorus::tree_reduce<arch, float, aop>),
                           &chorus::tree_allreduce<arch, float, aop>, &chorus::recursive_doubling_allreduce<arch, float, aop>,
                           &chorus::rabenseifner_allreduce<arch, float, aop>, &chorus::ring_allreduce<arch, float, csum>,
                           &chorus::ring_reduce_scatter<arch, float, csum>, &chorus::tree_reduce_scatter<arch, float, aop>,
                           &chorus::pairwise_alltoall<arch, float>,
                           static_cast<void (*)(arch&, std::span<float const>, std::vector<int> const&, std::span<float>,
                                                std::vector<int> const&)>(
                               &chorus::pairwise_alltoallv<arch, float, std::vector<int>, std::vector<int>>),
                           &chorus::linear_gatherv<arch, float, std::vector<int>>,
                           &chorus::linear_scatterv<arch, float, std::vector<int>>,
                           &chorus::ring_allgatherv<arch, float, std::vector<int>>,
                           &chorus::ring_reduce_scatterv<arch, float, std::vector<int>, csum>,
                           &chorus::tree_reduce_scatterv<arch, float, std::vector<int>, aop>,
                           &chorus::recursive_doubling_scan<arch, float, aop>,
                           &chorus::recursive_doubling_exscan<arch, float, aop>));

TEST_CASE("allreduce: every algorithm, op, type and size against the oracle") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce(tp, f); });
}

TEST_CASE("allreduce: a non-commutative op keeps rank order in every order-preserving algorithm") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce_noncommutative(tp, f); });
}

TEST_CASE("allreduce: a user lambda marked commutative runs on the ring") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce_user_commutative(tp, f); });
}

TEST_CASE("allreduce: the pipelined ring with tiny segments and windows, default segments, identical bits") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allreduce_pipelined(tp, f); });
}

TEST_CASE("in-flight schedules over a rendezvous transport that progresses only inside wait and test") {
    on_rendezvous_ranks(in_flight_schedules);
}

TEST_CASE("reduce: every root, op, type and size, in place and into a separate buffer") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::reduce(tp, f); });
}

TEST_CASE("reduce_scatter: ring and tree, every op, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::reduce_scatter(tp, f); });
}

TEST_CASE("broadcast: tree, linear and scatter_allgather, every root, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::broadcast(tp, f); });
}

TEST_CASE("scatter and gather: every root, type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::scatter_gather(tp, f); });
}

TEST_CASE("allgather: ring, bruck and automatic, every type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::allgather(tp, f); });
}

TEST_CASE("alltoall: the transpose, pairwise, bruck and automatic, every type and size") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::alltoall(tp, f); });
}

TEST_CASE("alltoallv: skewed counts with zero blocks, packed and with explicit displacements") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::alltoallv(tp, f); });
}

TEST_CASE("gatherv, scatterv and allgatherv: skewed counts with zero blocks") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::gather_scatter_v(tp, f); });
}

// In two test cases: the slowest check of the matrix (35 s under ThreadSanitizer on the 2-core
// VM at every rank count), each half well inside ctest's timeout on a slower machine.
TEST_CASE("reduce_scatter with per-rank counts at 1 to 4 ranks") {
    constexpr rank_t counts[] = {1, 2, 3, 4};
    on_rank_counts(counts, [](auto& tp, failures& f) { checks::reduce_scatter_v(tp, f); });
}

TEST_CASE("reduce_scatter with per-rank counts at 5, 7 and 8 ranks") {
    constexpr rank_t counts[] = {5, 7, 8};
    on_rank_counts(counts, [](auto& tp, failures& f) { checks::reduce_scatter_v(tp, f); });
}

TEST_CASE("allgather and alltoall in place") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::in_place(tp, f); });
}

TEST_CASE("scan and exscan") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::scans(tp, f); });
}

TEST_CASE("sub-groups: split, group, a group of a group") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::groups(tp, f); });
}

TEST_CASE("nonblocking collectives") {
    on_all_rank_counts([](auto& tp, failures& f) { checks::nonblocking(tp, f); });
}

TEST_CASE("automatic broadcast, allgather and alltoall: thresholds, CHORUS_ALGO names for the new schedules") {
    using chorus::detail::choose_allgather;
    using chorus::detail::choose_broadcast;
    constexpr std::size_t large = chorus::detail::broadcast_large_bytes;
    CHECK(choose_broadcast(1, large).algorithm == chorus::tree::name);
    CHECK(choose_broadcast(2, 64 << 20).algorithm == chorus::tree::name);
    CHECK(choose_broadcast(3, large).algorithm == chorus::tree::name);
    CHECK(choose_broadcast(4, 64 << 20).algorithm == chorus::tree::name);  // measured: the tree wins at p <= 4
    CHECK(choose_broadcast(5, large - 1).algorithm == chorus::tree::name);
    CHECK(choose_broadcast(5, large).algorithm == chorus::scatter_allgather::name);
    CHECK(choose_broadcast(8, 64 << 20).algorithm == chorus::scatter_allgather::name);
    constexpr std::size_t small = chorus::detail::allgather_small_bytes;
    CHECK(choose_allgather(3, 8).algorithm == chorus::ring::name);
    CHECK(choose_allgather(4, small).algorithm == chorus::bruck::name);
    CHECK(choose_allgather(7, 8).algorithm == chorus::bruck::name);
    CHECK(choose_allgather(8, small + 1).algorithm == chorus::ring::name);
    // Over nodes (a transport with a hierarchy): hierarchical broadcast with several nodes of
    // several ranks, hierarchical allgather only when the nodes are of equal sizes.
    struct nodes_of {
        rank_t count;
        bool equal;
        rank_t nodes() const { return count; }
        bool equal_nodes() const { return equal; }
    };
    struct over_nodes {
        nodes_of h;
        rank_t p;
        nodes_of& hierarchy() { return h; }
        rank_t size() const { return p; }
    };
    using chorus::detail::choose_allgather_over;
    using chorus::detail::choose_broadcast_over;
    over_nodes two_by_two{{2, true}, 4}, three_two{{2, false}, 5}, one_each{{4, true}, 4}, one_node{{1, true}, 4};
    CHECK(choose_broadcast_over(two_by_two, 8).algorithm == chorus::hierarchical::name);
    CHECK(choose_broadcast_over(three_two, large).algorithm == chorus::hierarchical::name);
    CHECK(choose_broadcast_over(one_each, 8).algorithm == chorus::tree::name);
    CHECK(choose_broadcast_over(one_node, 8).algorithm == chorus::tree::name);
    CHECK(choose_allgather_over(two_by_two, 8).algorithm == chorus::hierarchical::name);
    CHECK(choose_allgather_over(three_two, 8).algorithm == chorus::bruck::name);
    CHECK(choose_allgather_over(one_each, 8).algorithm == chorus::bruck::name);
    CHECK(choose_allgather_over(one_node, small + 1).algorithm == chorus::ring::name);

    using chorus::detail::choose_alltoall;
    CHECK(choose_alltoall(8, 4).algorithm == chorus::pairwise::name);
    CHECK(choose_alltoall(chorus::detail::alltoall_bruck_min_ranks, 4).algorithm == chorus::bruck::name);
    CHECK(choose_alltoall(chorus::detail::alltoall_bruck_min_ranks, 64 << 10).algorithm == chorus::pairwise::name);

    // Each name forces its schedule through the automatic front door (the result says it ran
    // correctly; CHORUS_DEBUG would name it); a name of another collective is rejected.
    for (char const* env : {"broadcast:scatter_allgather,allgather:bruck,alltoall:bruck",
                            "broadcast: linear , allgather: ring, alltoall : pairwise"}) {
        ::setenv("CHORUS_ALGO", env, 1);
        failures f;
        chorus::run_ranks(5, [&](auto& tp) {
            std::vector<int> v(11, tp.rank() == 3 ? 7 : 0);
            chorus::broadcast(tp, v, 3);
            compare(f, std::string("broadcast with CHORUS_ALGO=") + env, v, [](std::size_t) { return 7; });
            std::vector<int> mine(2, tp.rank()), all(10, -1);
            chorus::allgather(tp, mine, all);
            compare(f, std::string("allgather with CHORUS_ALGO=") + env, all,
                    [](std::size_t i) { return static_cast<int>(i / 2); });
            std::vector<int> send(5), recv(5, -1);
            for (int j = 0; j < 5; ++j) send[static_cast<std::size_t>(j)] = tp.rank() * 10 + j;
            chorus::alltoall(tp, send, recv);
            compare(f, std::string("alltoall with CHORUS_ALGO=") + env, recv,
                    [&](std::size_t i) { return static_cast<int>(i) * 10 + tp.rank(); });
        });
        ::unsetenv("CHORUS_ALGO");
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
    CHECK(chorus::scatter_allgather::name == "scatter_allgather");
    CHECK(chorus::bruck::name == "bruck");
    ::setenv("CHORUS_ALGO", "broadcast:bruck", 1);
    std::atomic<int> rejected{0};
    chorus::run_ranks(3, [&](auto& tp) {
        std::vector<int> v(4);
        try {
            chorus::broadcast(tp, v, 0);
        } catch (chorus::error const& e) {
            if (std::string(e.what()).find("scatter_allgather") != std::string::npos) rejected.fetch_add(1);
        }
    });
    ::unsetenv("CHORUS_ALGO");
    CHECK(rejected.load() == 3);  // every rank lists the valid names, scatter_allgather among them
}

TEST_CASE("barrier: no rank leaves before every rank arrived") {
    for (rank_t p : rank_counts) {
        std::atomic<int> arrived{0};
        std::atomic<int> early{0};
        chorus::run_ranks(p, [&](auto& tp) {
            for (int round = 1; round <= 5; ++round) {
                // Stagger arrivals so that a barrier releasing early would be seen.
                std::this_thread::sleep_for(std::chrono::microseconds(200 * ((tp.rank() + round) % 3)));
                arrived.fetch_add(1);
                chorus::barrier(tp);
                if (arrived.load() < round * p) early.fetch_add(1);
                chorus::barrier<chorus::dissemination>(tp);  // keep rounds apart
            }
        });
        CHECK_MESSAGE(early.load() == 0, "p = " << p);
    }
}
