// SPDX-License-Identifier: MIT
// The seed article's own examples, at its 4 ranks, must print exactly its results.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <mutex>
#include <vector>

using chorus::rank_t;

namespace {
// Results per rank, filled by the rank threads and checked by the test thread.
template <class T>
struct per_rank {
    std::mutex mutex;
    std::vector<std::vector<T>> values = std::vector<std::vector<T>>(4);
    void set(rank_t r, std::vector<T> v) {
        std::lock_guard lock(mutex);
        values[static_cast<std::size_t>(r)] = std::move(v);
    }
};
} // namespace

TEST_CASE("seed 2.1: broadcast [1,2,3] from rank 0") {
    per_rank<float> out;
    chorus::run_ranks(4, [&](auto& tp) {
        std::vector<float> t = tp.rank() == 0 ? std::vector<float>{1, 2, 3} : std::vector<float>{0, 0, 0};
        chorus::broadcast(tp, t, 0);
        out.set(tp.rank(), t);
    });
    for (auto const& v : out.values) CHECK(v == std::vector<float>{1, 2, 3});
}

TEST_CASE("seed 2.2: scatter [10..13] and gather the rank numbers") {
    per_rank<float> scattered, gathered;
    chorus::run_ranks(4, [&](auto& tp) {
        std::vector<float> recv(1);
        std::vector<float> list;
        if (tp.rank() == 0) list = {10, 11, 12, 13};
        chorus::scatter(tp, list, recv, 0);
        scattered.set(tp.rank(), recv);
        std::vector<float> send{float(tp.rank())}, all(tp.rank() == 0 ? 4 : 0);
        chorus::gather(tp, send, all, 0);
        gathered.set(tp.rank(), all);
    });
    for (rank_t r = 0; r < 4; ++r) CHECK(scattered.values[size_t(r)] == std::vector<float>{10.0f + float(r)});
    CHECK(gathered.values[0] == std::vector<float>{0, 1, 2, 3});
}

TEST_CASE("seed 2.3: allgather gives every rank [0,1,2,3]") {
    per_rank<float> out;
    chorus::run_ranks(4, [&](auto& tp) {
        std::vector<float> local{float(tp.rank())}, all(4);
        chorus::allgather(tp, local, all);
        out.set(tp.rank(), all);
    });
    for (auto const& v : out.values) CHECK(v == std::vector<float>{0, 1, 2, 3});
}

TEST_CASE("seed 2.4: allreduce SUM = 10 and AVG = 2.5 over grads 1..4") {
    per_rank<float> sums, avgs;
    chorus::run_ranks(4, [&](auto& tp) {
        std::vector<float> s{float(tp.rank() + 1)}, a = s;
        chorus::allreduce(tp, s, chorus::sum{});
        chorus::allreduce(tp, a, chorus::avg{});
        sums.set(tp.rank(), s);
        avgs.set(tp.rank(), a);
    });
    for (rank_t r = 0; r < 4; ++r) {
        CHECK(sums.values[size_t(r)] == std::vector<float>{10});
        CHECK(avgs.values[size_t(r)] == std::vector<float>{2.5f});
    }
}

TEST_CASE("seed 2.5: reduce_scatter gives 60, 64, 68, 72") {
    per_rank<float> out;
    chorus::run_ranks(4, [&](auto& tp) {
        std::vector<float> in(4), o(1);
        for (int j = 0; j < 4; ++j) in[size_t(j)] = float(tp.rank() * 10 + j);
        chorus::reduce_scatter(tp, in, o, chorus::sum{});
        out.set(tp.rank(), o);
    });
    for (rank_t r = 0; r < 4; ++r) CHECK(out.values[size_t(r)] == std::vector<float>{60.0f + 4.0f * float(r)});
}

TEST_CASE("seed 2.6: alltoall transposes, alltoallv splits (rank + j) % 3 + 1") {
    per_rank<float> equal, variable;
    chorus::run_ranks(4, [&](auto& tp) {
        rank_t const rank = tp.rank();
        std::vector<float> send(4), recv(4);
        for (int j = 0; j < 4; ++j) send[size_t(j)] = float(j + rank * 10);
        chorus::alltoall(tp, send, recv);
        equal.set(rank, recv);
        std::vector<int> out_splits(4), in_splits(4);
        for (int j = 0; j < 4; ++j) out_splits[size_t(j)] = in_splits[size_t(j)] = (rank + j) % 3 + 1;
        std::vector<float> send_v(size_t(out_splits[0] + out_splits[1] + out_splits[2] + out_splits[3]), float(rank));
        std::vector<float> recv_v(size_t(in_splits[0] + in_splits[1] + in_splits[2] + in_splits[3]));
        chorus::alltoallv(tp, send_v, out_splits, recv_v, in_splits);
        variable.set(rank, recv_v);
    });
    CHECK(equal.values[0] == std::vector<float>{0, 10, 20, 30});
    CHECK(equal.values[1] == std::vector<float>{1, 11, 21, 31});
    CHECK(equal.values[2] == std::vector<float>{2, 12, 22, 32});
    CHECK(equal.values[3] == std::vector<float>{3, 13, 23, 33});
    CHECK(variable.values[0] == std::vector<float>{0, 1, 1, 2, 2, 2, 3});
    CHECK(variable.values[1] == std::vector<float>{0, 0, 1, 1, 1, 2, 3, 3});
    CHECK(variable.values[2] == std::vector<float>{0, 0, 0, 1, 2, 2, 3, 3, 3});
    CHECK(variable.values[3] == std::vector<float>{0, 1, 1, 2, 2, 2, 3});
}

TEST_CASE("seed 3: ring allreduce from sendrecv equals chorus::allreduce: 600..628") {
    per_rank<float> mine_out, ref_out;
    chorus::run_ranks(4, [&](auto& tp) {
        rank_t const rank = tp.rank(), world = tp.size();
        rank_t const left = (rank - 1 + world) % world, right = (rank + 1) % world;
        std::size_t const n = size_t(world) * 2;
        std::vector<float> x(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = float(i) + float(rank) * 100;
        std::vector<float> ref = x;
        chorus::allreduce(tp, ref, chorus::sum{});
        std::vector<float> mine = x;
        std::size_t const c = n / size_t(world);
        auto chunk = [&](rank_t i) { return std::span<float>(mine).subspan(size_t((i % world + world) % world) * c, c); };
        std::vector<float> buf(c);
        for (rank_t step = 0; step < world - 1; ++step) {  // reduce-scatter: add
            chorus::sendrecv(tp, right, chunk(rank - step), left, buf);
            auto acc = chunk(rank - step - 1);
            for (std::size_t i = 0; i < c; ++i) acc[i] += buf[i];
        }
        for (rank_t step = 0; step < world - 1; ++step) {  // allgather: overwrite
            chorus::sendrecv(tp, right, chunk(rank + 1 - step), left, buf);
            std::ranges::copy(buf, chunk(rank - step).begin());
        }
        mine_out.set(rank, mine);
        ref_out.set(rank, ref);
    });
    std::vector<float> const want{600, 604, 608, 612, 616, 620, 624, 628};
    for (rank_t r = 0; r < 4; ++r) {
        CHECK(mine_out.values[size_t(r)] == ref_out.values[size_t(r)]);
        CHECK(ref_out.values[size_t(r)] == want);
    }
}
