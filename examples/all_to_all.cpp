// SPDX-License-Identifier: MIT
// alltoall and alltoallv: the distributed transpose. Equal-size: element j of rank i's send
// (i * 10 + j) goes to rank j, which receives in slot i what rank i meant for it. Variable-size,
// the MoE routing shape: rank r sends (r + j) % 3 + 1 copies of its rank number to rank j.
// The receive counts are first exchanged with a small alltoall of the send counts, as real MoE
// code must (the seed computes them from the rule; here that rule is the check). The groups of
// recv_v are printed as the seed does: one group per source rank. Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/all_to_all
//
// Expected output (lines of different ranks may interleave):
//   [rank0] equal-size before send = [0.0, 1.0, 2.0, 3.0]  after recv = [0.0, 10.0, 20.0, 30.0]
//   [rank1] equal-size before send = [10.0, 11.0, 12.0, 13.0]  after recv = [1.0, 11.0, 21.0, 31.0]
//   [rank2] equal-size before send = [20.0, 21.0, 22.0, 23.0]  after recv = [2.0, 12.0, 22.0, 32.0]
//   [rank3] equal-size before send = [30.0, 31.0, 32.0, 33.0]  after recv = [3.0, 13.0, 23.0, 33.0]
//   [rank0] variable-size send counts=[1,2,3,1] recv counts=[1,2,3,1] recv_v = [0, 1,1, 2,2,2, 3]
//   [rank1] variable-size send counts=[2,3,1,2] recv counts=[2,3,1,2] recv_v = [0,0, 1,1,1, 2, 3,3]
//   [rank2] variable-size send counts=[3,1,2,3] recv counts=[3,1,2,3] recv_v = [0,0,0, 1, 2,2, 3,3,3]
//   [rank3] variable-size send counts=[1,2,3,1] recv counts=[1,2,3,1] recv_v = [0, 1,1, 2,2,2, 3]

#include "example_util.hpp"
#include <cstddef>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

/// The values with a "," inside each source's group and ", " between groups: [0, 1,1, 2,2,2, 3].
std::string format_groups(std::vector<int> const& values, std::vector<int> const& counts) {
    std::string s = "[";
    std::size_t at = 0;
    for (int count : counts) {
        if (count == 0) continue;
        if (at) s += ", ";
        for (int k = 0; k < count; ++k, ++at) {
            // Two appends, not s += (k ? "," : "") + ...: g++ 12 at -O3 warns (-Wrestrict) of an
            // overlap inside the temporary string's insert that cannot happen.
            if (k) s += ',';
            s += std::to_string(values[at]);
        }
    }
    return s + "]";
}

bool equal_size(auto& tp) {
    auto const world = static_cast<std::size_t>(tp.size());
    auto const rank = static_cast<std::size_t>(tp.rank());
    std::vector<float> send(world), recv(world, 0.0f), expected(world);
    for (std::size_t j = 0; j < world; ++j) {
        send[j] = static_cast<float>(rank * 10 + j);      // meant for rank j
        expected[j] = static_cast<float>(j * 10 + rank);  // what rank j meant for this rank
    }

    chorus::alltoall(tp, send, recv);

    std::cout << "equal-size before send = " << example::format_list(send)
              << "  after recv = " << example::format_list(recv) << std::endl;
    if (recv == expected) return true;
    std::cerr << "alltoall: rank " << rank << " got " << example::format_list(recv) << ", expected "
              << example::format_list(expected) << std::endl;
    return false;
}

bool variable_size(auto& tp) {
    auto const world = static_cast<std::size_t>(tp.size());
    int const rank = tp.rank();
    auto const split = [](int from, int to) { return (from + to) % 3 + 1; };  // elements rank `from` sends `to`

    std::vector<int> send_counts(world), recv_counts(world, 0);
    for (std::size_t j = 0; j < world; ++j) send_counts[j] = split(rank, static_cast<int>(j));
    // Count exchange: one int per pair, so rank j's send_counts[rank] lands in our recv_counts[j].
    chorus::alltoall(tp, send_counts, recv_counts);

    auto const total = [](std::vector<int> const& c) {
        return static_cast<std::size_t>(std::reduce(c.begin(), c.end()));
    };
    std::vector<int> send_v(total(send_counts), rank);  // every element says where it came from
    std::vector<int> recv_v(total(recv_counts), -1);
    chorus::alltoallv(tp, send_v, send_counts, recv_v, recv_counts);

    std::cout << "variable-size send counts=" << example::format_list(send_counts, ",")
              << " recv counts=" << example::format_list(recv_counts, ",")
              << " recv_v = " << format_groups(recv_v, recv_counts) << std::endl;

    std::vector<int> expected_counts(world), expected_v;
    for (std::size_t j = 0; j < world; ++j) {
        expected_counts[j] = split(static_cast<int>(j), rank);
        expected_v.insert(expected_v.end(), static_cast<std::size_t>(expected_counts[j]), static_cast<int>(j));
    }
    if (recv_counts == expected_counts && recv_v == expected_v) return true;
    std::cerr << "alltoallv: rank " << rank << " got counts " << example::format_list(recv_counts) << " and "
              << example::format_list(recv_v) << ", expected " << example::format_list(expected_counts) << " and "
              << example::format_list(expected_v) << std::endl;
    return false;
}

} // namespace

int main() {
    return example::run_rank([](auto& tp) {
        bool const ok_equal = equal_size(tp);
        bool const ok_variable = variable_size(tp);
        return ok_equal && ok_variable ? 0 : 1;
    });
}
