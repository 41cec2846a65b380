// SPDX-License-Identifier: MIT
// Ring allreduce (SUM) built only from point-to-point chorus::sendrecv, as the seed builds it
// from Send/Recv, and checked against chorus::allreduce on the same input. The vector is cut
// into p chunks; in p - 1 reduce-scatter steps each rank sends one chunk to its right
// neighbour and adds the chunk from its left one, after which chunk (r + 1) % p on rank r is
// fully reduced; p - 1 allgather steps then pass the reduced chunks round the ring, overwriting.
// Input x[i] = i + 100 r on rank r, so the sum is p i + 100 p (p - 1) / 2. The seed's case has
// 2p elements; two more cases check counts that p does not divide (chunk sizes differ by one)
// and fewer elements than ranks (some chunks empty). Works for any number of ranks.
//
// Usage: chorusrun -n 4 build/examples/ring_allreduce_from_scratch
//
// Expected output (lines of different ranks may interleave):
//   [rank0] n=8: from scratch == chorus::allreduce ? match: true
//   [rank1] n=8: from scratch == chorus::allreduce ? match: true
//   [rank2] n=8: from scratch == chorus::allreduce ? match: true
//   [rank3] n=8: from scratch == chorus::allreduce ? match: true
//   [rank0] chorus::allreduce result = [600.0, 604.0, 608.0, 612.0, 616.0, 620.0, 624.0, 628.0]
//   [rank0] from-scratch result      = [600.0, 604.0, 608.0, 612.0, 616.0, 620.0, 624.0, 628.0]
//   [rank0] n=9 (not a multiple of 4): match: true
//   [rank1] n=9 (not a multiple of 4): match: true
//   [rank2] n=9 (not a multiple of 4): match: true
//   [rank3] n=9 (not a multiple of 4): match: true
//   [rank0] n=3 (fewer elements than ranks): match: true
//   [rank1] n=3 (fewer elements than ranks): match: true
//   [rank2] n=3 (fewer elements than ranks): match: true
//   [rank3] n=3 (fewer elements than ranks): match: true

#include "example_util.hpp"
#include <cstddef>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

/// Chunk c of n elements split into p: the first n % p chunks get one element more, so any n
/// works (torch.chunk, which the seed uses, needs n divisible by p for p equal chunks).
std::span<float> chunk(std::span<float> data, std::size_t c, std::size_t p) {
    std::size_t const base = data.size() / p, extra = data.size() % p;
    std::size_t const begin = c * base + (c < extra ? c : extra);
    return data.subspan(begin, base + (c < extra ? 1 : 0));
}

void ring_allreduce(auto& tp, std::span<float> data) {
    auto const p = static_cast<std::size_t>(tp.size());
    auto const rank = static_cast<std::size_t>(tp.rank());
    auto const left = static_cast<chorus::rank_t>((rank + p - 1) % p);  // receive from
    auto const right = static_cast<chorus::rank_t>((rank + 1) % p);     // send to
    std::vector<float> incoming;

    // Reduce-scatter: at step s send chunk (r - s) and add the received chunk (r - s - 1). The
    // right neighbour receives into exactly the chunk index we send, so sizes always agree.
    for (std::size_t step = 0; step + 1 < p; ++step) {
        auto const out = chunk(data, (rank + p - step) % p, p);
        auto const in = chunk(data, (rank + 2 * p - step - 1) % p, p);
        incoming.resize(in.size());
        // sendrecv posts the receive before the send: all ranks sending at once cannot deadlock.
        chorus::sendrecv(tp, right, out, left, incoming);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] += incoming[i];
    }
    // Now chunk (r + 1) % p on rank r holds the global sum. Allgather: at step s send chunk
    // (r + 1 - s), which is reduced (or was just received), and overwrite chunk (r - s).
    for (std::size_t step = 0; step + 1 < p; ++step) {
        auto const out = chunk(data, (rank + 1 + p - step) % p, p);
        auto const in = chunk(data, (rank + p - step) % p, p);
        chorus::sendrecv(tp, right, out, left, in);  // receives straight into place: a copy, not a sum
    }
}

/// Runs one case of n elements; returns whether the ring, chorus::allreduce and the closed
/// form agree. Every value is a small whole number, so float sums are exact in any order and
/// equality (not a tolerance) is the right check.
bool run_case(auto& tp, std::size_t n, std::string const& label, bool print_values) {
    auto const p = static_cast<float>(tp.size());
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) + 100.0f * static_cast<float>(tp.rank());

    std::vector<float> reference = x;
    chorus::allreduce(tp, reference, chorus::sum{});
    std::vector<float> mine = x;
    ring_allreduce(tp, mine);

    std::vector<float> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = p * static_cast<float>(i) + 100.0f * p * (p - 1.0f) / 2.0f;
    bool const match = mine == reference;
    std::cout << label << (match ? "match: true" : "match: false") << std::endl;
    if (print_values) {
        std::cout << "chorus::allreduce result = " << example::format_list(reference) << std::endl;
        std::cout << "from-scratch result      = " << example::format_list(mine) << std::endl;
    }
    if (match && reference == expected) return true;
    std::cerr << "n=" << n << ": ring " << example::format_list(mine) << ", chorus::allreduce "
              << example::format_list(reference) << ", expected " << example::format_list(expected) << std::endl;
    return false;
}

} // namespace

int main() {
    return example::run_rank([](auto& tp) {
        auto const p = static_cast<std::size_t>(tp.size());
        auto const n = [](std::size_t count) { return "n=" + std::to_string(count); };
        bool const seed_case = run_case(tp, 2 * p, n(2 * p) + ": from scratch == chorus::allreduce ? ", tp.rank() == 0);
        // With one rank every count is a multiple of p and none is below it: nothing more to show.
        bool const uneven =
            p == 1 || run_case(tp, 2 * p + 1, n(2 * p + 1) + " (not a multiple of " + std::to_string(p) + "): ", false);
        bool const sparse = p == 1 || run_case(tp, p - 1, n(p - 1) + " (fewer elements than ranks): ", false);
        return seed_case && uneven && sparse ? 0 : 1;
    });
}
