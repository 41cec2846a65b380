// SPDX-License-Identifier: MIT
// MoE token dispatch and combine with alltoallv, the expert-parallel pattern of the seed's
// section 2.6. Each rank holds T tokens (feature vectors, pseudo-random from rank and seed);
// a linear router picks one expert per token (top-1); expert e lives on rank e % p. Because
// routing depends on the data, every rank sends a different number of tokens to each rank:
//   1. a small alltoall exchanges the token counts per (destination rank, local expert), so
//      each rank learns how much it will receive and for which of its experts;
//   2. alltoallv dispatches the token features, grouped by destination and expert;
//   3. each rank applies its experts (expert e computes x * (e + 1) + e);
//   4. a second alltoallv with the counts swapped combines the results back, and the home
//      rank restores the tokens' original order.
// Every rank then recomputes all ranks' tokens and routes locally, with no communication, and
// checks what it received and its final outputs against that. Works for any number of ranks
// (with more than 8 ranks some host no expert).
//
// Usage: chorusrun -n 4 build/examples/moe_alltoallv
//
// Expected output (lines of different ranks may interleave):
//   [rank0] experts [0, 4], 8 tokens: sent per destination = [1, 2, 5, 0], received per source = [1, 1, 3, 3]
//   [rank1] experts [1, 5], 8 tokens: sent per destination = [1, 2, 4, 1], received per source = [2, 2, 3, 2]
//   [rank2] experts [2, 6], 8 tokens: sent per destination = [3, 3, 2, 0], received per source = [5, 4, 2, 2]
//   [rank3] experts [3, 7], 8 tokens: sent per destination = [3, 2, 2, 1], received per source = [0, 1, 0, 1]
//   [rank0] combined in original order: max abs error = 0.0, match: true
//   [rank1] combined in original order: max abs error = 0.0, match: true
//   [rank2] combined in original order: max abs error = 0.0, match: true
//   [rank3] combined in original order: max abs error = 0.0, match: true

#include "example_util.hpp"
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

constexpr std::size_t tokens_per_rank = 8;
constexpr std::size_t features = 4;
constexpr std::size_t experts = 8;
constexpr std::uint64_t seed = 2024;

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/// Multiples of 1/64 in [-2, 2]: few significant bits, so every expert's arithmetic is exact
/// and the distributed result must equal the local one bit for bit.
float feature(std::size_t rank, std::size_t token, std::size_t d) {
    std::uint64_t const h = splitmix64(seed ^ splitmix64((rank * tokens_per_rank + token) * features + d));
    return static_cast<float>(static_cast<int>(h % 257) - 128) / 64.0f;
}

std::vector<float> token_features(std::size_t rank, std::size_t token) {
    std::vector<float> x(features);
    for (std::size_t d = 0; d < features; ++d) x[d] = feature(rank, token, d);
    return x;
}

/// The router: argmax over experts of <x, w_e>, with fixed pseudo-random weights w_e.
std::size_t route(std::vector<float> const& x) {
    std::size_t best = 0;
    float best_score = 0.0f;
    for (std::size_t e = 0; e < experts; ++e) {
        float score = 0.0f;
        for (std::size_t d = 0; d < features; ++d) {
            std::uint64_t const h = splitmix64(~seed ^ splitmix64(e * features + d));
            score += x[d] * (static_cast<float>(static_cast<int>(h % 201) - 100) / 100.0f);
        }
        if (e == 0 || score > best_score) {  // ties go to the lower expert
            best = e;
            best_score = score;
        }
    }
    return best;
}

float apply_expert(std::size_t e, float x) { return x * static_cast<float>(e + 1) + static_cast<float>(e); }

/// Element counts for alltoallv from token counts.
std::vector<int> times_features(std::vector<int> const& tokens) {
    std::vector<int> out(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) out[i] = tokens[i] * static_cast<int>(features);
    return out;
}

int run(auto& tp) {
    auto const p = static_cast<std::size_t>(tp.size());
    auto const rank = static_cast<std::size_t>(tp.rank());
    // Expert e lives on rank e % p as local slot e / p; every rank reserves the same number
    // of slots so that the count exchange has equal blocks.
    std::size_t const slots = (experts + p - 1) / p;

    // Route the local tokens and order them by (destination rank, local expert slot).
    std::vector<std::vector<float>> x(tokens_per_rank);
    std::vector<std::size_t> expert_of(tokens_per_rank);
    for (std::size_t t = 0; t < tokens_per_rank; ++t) {
        x[t] = token_features(rank, t);
        expert_of[t] = route(x[t]);
    }
    auto const bucket = [&](std::size_t e) { return (e % p) * slots + e / p; };
    std::vector<std::size_t> order(tokens_per_rank);  // send position -> original token index
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return bucket(expert_of[a]) < bucket(expert_of[b]); });

    // 1. Counts: block j of send_slot_counts holds how many tokens go to each expert of rank j.
    std::vector<int> send_slot_counts(p * slots, 0), recv_slot_counts(p * slots, 0);
    for (std::size_t t = 0; t < tokens_per_rank; ++t) ++send_slot_counts[bucket(expert_of[t])];
    chorus::alltoall(tp, send_slot_counts, recv_slot_counts);
    std::vector<int> sent(p, 0), received(p, 0);
    for (std::size_t j = 0; j < p; ++j)
        for (std::size_t k = 0; k < slots; ++k) {
            sent[j] += send_slot_counts[j * slots + k];
            received[j] += recv_slot_counts[j * slots + k];
        }

    // 2. Dispatch.
    std::vector<float> send_buf;
    for (std::size_t t : order) send_buf.insert(send_buf.end(), x[t].begin(), x[t].end());
    auto const total_received = static_cast<std::size_t>(std::reduce(received.begin(), received.end()));
    std::vector<float> recv_buf(total_received * features);
    chorus::alltoallv(tp, send_buf, times_features(sent), recv_buf, times_features(received));

    // 3. Experts: the received tokens come grouped by source rank, then by local expert slot.
    std::size_t at = 0;
    for (std::size_t j = 0; j < p; ++j)
        for (std::size_t k = 0; k < slots; ++k)
            for (int n = 0; n < recv_slot_counts[j * slots + k]; ++n)
                for (std::size_t d = 0; d < features; ++d, ++at)
                    recv_buf[at] = apply_expert(rank + k * p, recv_buf[at]);

    // 4. Combine: the same blocks travel back, so the counts swap roles.
    std::vector<float> back(send_buf.size());
    chorus::alltoallv(tp, recv_buf, times_features(received), back, times_features(sent));
    std::vector<std::vector<float>> y(tokens_per_rank, std::vector<float>(features));
    for (std::size_t i = 0; i < tokens_per_rank; ++i)
        std::copy_n(back.begin() + static_cast<std::ptrdiff_t>(i * features), features, y[order[i]].begin());

    // The check: route every rank's tokens here and apply the experts directly.
    std::vector<int> expected_received(p, 0);
    for (std::size_t s = 0; s < p; ++s)
        for (std::size_t t = 0; t < tokens_per_rank; ++t)
            if (route(token_features(s, t)) % p == rank) ++expected_received[s];
    double max_error = 0.0;
    for (std::size_t t = 0; t < tokens_per_rank; ++t)
        for (std::size_t d = 0; d < features; ++d)
            max_error = std::max(max_error, std::abs(double(y[t][d]) - double(apply_expert(expert_of[t], x[t][d]))));
    bool const match = received == expected_received && max_error == 0.0;

    std::vector<std::size_t> here;
    for (std::size_t e = rank; e < experts; e += p) here.push_back(e);
    std::cout << "experts " << example::format_list(here) << ", " << tokens_per_rank
              << " tokens: sent per destination = " << example::format_list(sent)
              << ", received per source = " << example::format_list(received) << std::endl;
    std::cout << "combined in original order: max abs error = " << example::format_value(max_error)
              << ", match: " << (match ? "true" : "false") << std::endl;
    if (match) return 0;
    std::cerr << "moe: rank " << rank << " received " << example::format_list(received) << " (expected "
              << example::format_list(expected_received) << "), max abs error " << max_error << std::endl;
    return 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
