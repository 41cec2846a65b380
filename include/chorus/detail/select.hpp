// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Run-time algorithm choice for the front doors called without a tag: the thresholds, the
// CHORUS_ALGO override ("allreduce:ring,broadcast:tree", as NCCL_ALGO) and CHORUS_DEBUG
// logging of what was chosen and why. docs/algorithms.md explains the rules.

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <unistd.h>  // environ

#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus::detail {

constexpr std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

/// getenv for the variables every automatic collective reads (CHORUS_ALGO, CHORUS_DEBUG),
/// cheaper while the environment is unchanged. glibc's getenv compares every variable's name:
/// 30 ns each for 40 variables, and on one host a whole 8-byte allreduce takes 400 ns
/// (docs/algorithms.md). This keeps the environment's entries as it last saw them, pointer for
/// pointer, and the value found there: the same array holding the same pointers is the same
/// environment (setenv and putenv put a new pointer in, unsetenv shifts the entries), so the
/// value is returned without reading a string; any change makes it search again. Not noticed:
/// a string handed to putenv and then edited in place (set it again instead). One per thread:
/// threads never share its state.
class env_probe {
public:
    explicit env_probe(std::string_view name) noexcept : name_(name) {}

    char const* get() noexcept {
        char** const env = environ;
        if (env != nullptr && env == array_ && unchanged(env)) return value_;
        return search(env);
    }

private:
    bool names(char const* entry) const noexcept {
        return std::strncmp(entry, name_.data(), name_.size()) == 0 && entry[name_.size()] == '=';
    }
    // The same entries up to the terminator; never reads past it (a shorter array differs at
    // its null entry first).
    bool unchanged(char** env) const noexcept {
        for (std::size_t i = 0;; ++i) {
            if (i == seen_.size()) return env[i] == nullptr;
            if (env[i] != seen_[i]) return false;
        }
    }
    char const* search(char** env) noexcept {
        array_ = nullptr;
        value_ = nullptr;
        if (env == nullptr) return nullptr;
        std::size_t n = 0;
        for (; env[n] != nullptr; ++n)
            if (value_ == nullptr && names(env[n])) value_ = env[n] + name_.size() + 1;
        try {
            seen_.assign(env, env + n);
            array_ = env;
        } catch (...) {  // no memory for the copy: search on every call
        }
        return value_;
    }

    std::string_view name_;
    char** array_ = nullptr;
    std::vector<char*> seen_;
    char const* value_ = nullptr;
};

/// The algorithm CHORUS_ALGO names for `collective`, or "" (read on every call, so tests and
/// programs may change it between collectives).
inline std::string env_algorithm(std::string_view collective) {
    thread_local env_probe probe("CHORUS_ALGO");
    char const* env = probe.get();
    if (env == nullptr) return {};
    std::string_view rest(env);
    while (!rest.empty()) {
        std::size_t const comma = rest.find(',');
        std::string_view item = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        std::size_t const colon = item.find(':');
        if (colon != std::string_view::npos && trim(item.substr(0, colon)) == collective)
            return std::string(trim(item.substr(colon + 1)));
    }
    return {};
}

inline bool debug_enabled() noexcept {
    thread_local env_probe probe("CHORUS_DEBUG");
    char const* env = probe.get();
    return env != nullptr && *env != '\0' && std::string_view(env) != "0";
}

/// An algorithm (its tag's name) and why it was chosen.
struct choice {
    std::string_view algorithm;
    char const* reason;
};

/// Applies CHORUS_ALGO to an automatic choice. `allowed` are the algorithms this collective
/// has for this op; an unknown or inapplicable name is an error, not a silent fallback.
inline choice apply_override(std::string_view collective, choice automatic_choice, std::span<std::string_view const> allowed) {
    std::string const wanted = env_algorithm(collective);
    if (wanted.empty()) return automatic_choice;
    std::string options;
    for (std::string_view a : allowed) {
        if (wanted == a) return {a, "CHORUS_ALGO"};
        options += (options.empty() ? "" : ", ") + std::string(a);
    }
    throw invalid_argument(std::string(collective) + ": CHORUS_ALGO names '" + wanted + "' for " + std::string(collective) +
                           ", which is not one of its algorithms for this operation: " + options);
}

inline void log_choice(rank_t rank, rank_t size, std::string_view collective, std::size_t bytes, choice c) {
    if (!debug_enabled()) return;
    std::fprintf(stderr, "chorus: rank %d/%d %.*s %zu bytes -> %.*s (%s)\n", rank, size, static_cast<int>(collective.size()),
                 collective.data(), bytes, static_cast<int>(c.algorithm.size()), c.algorithm.data(), c.reason);
}

// Initial thresholds from the alpha-beta costs in the algorithm headers; they are to be fitted
// on measured TCP runs (docs/algorithms.md). Below the small limit latency
// dominates, so the log p exchange of whole vectors wins; above the large limit the ring's
// p-independent bandwidth term wins over Rabenseifner's extra fold traffic.
inline constexpr std::size_t allreduce_small_bytes = 16 * 1024;
inline constexpr std::size_t allreduce_large_bytes = 1024 * 1024;

inline choice choose_allreduce(rank_t p, std::size_t bytes, bool commutative) {
    if (p == 1) return {recursive_doubling::name, "one rank"};
    if (bytes <= allreduce_small_bytes) return {recursive_doubling::name, "small message: latency-bound"};
    if (!commutative) return {rabenseifner::name, "non-commutative op: rank-order halving/doubling"};
    if (bytes < allreduce_large_bytes) return {rabenseifner::name, "mid-size message"};
    return {ring::name, "large message: bandwidth-bound"};
}

// Whether the ranks are on several nodes, several on a node (a node_transport's hierarchy):
// where the hierarchical schedules keep bytes inside the nodes. `equal`: and every node has
// as many ranks.
template <class Transport>
bool spans_nodes(Transport& tp, bool equal = false) {
    if constexpr (requires { tp.hierarchy().nodes(); }) {
        auto& h = tp.hierarchy();
        return h.nodes() > 1 && h.nodes() < tp.size() && (!equal || h.equal_nodes());
    } else {
        return false;
    }
}

// Over ranks in several nodes (node_transport), the hierarchical schedule keeps the bytes of
// every phase but one inside the nodes (algorithm/hierarchical_allreduce.hpp); with one node,
// or one rank per node, it would only add steps.
template <class Transport>
choice choose_allreduce_over(Transport& tp, std::size_t bytes, bool commutative) {
    if (commutative && spans_nodes(tp)) return {hierarchical::name, "ranks on several nodes, several on a node"};
    return choose_allreduce(tp.size(), bytes, commutative);
}

// Broadcast: the binomial tree sends the whole vector ceil(log2 p) times along its critical
// path, scatter + allgather about twice the vector in (log2 p + p - 1) messages
// (algorithm/scatter_allgather_broadcast.hpp). For p = 2 the tree's one message is never
// slower than the two halves sent one after the other. At p = 3 and 4 the tree's critical
// path is at most 2 vectors against ~1.5, and measured the tree wins: 3 interleaved A/B runs
// at p = 4 on the 2-core test VM (2026-12-03) gave tree 2.2-2.3 / 7.2-8.6 / 28-30 ms at
// 1 / 4 / 16 MiB, scatter_allgather 2.1-2.7 / 11-12.5 / 31-34 ms (its p concurrent ring
// steps compete for the cores). From p = 5 (3 vectors on the tree's path) and 256 KiB on,
// the bytes saved outweigh the extra latencies (model; no such group measured here).
inline constexpr std::size_t broadcast_large_bytes = 256 * 1024;
inline constexpr rank_t broadcast_scatter_min_ranks = 5;

inline choice choose_broadcast(rank_t p, std::size_t bytes) {
    if (p <= 2) return {tree::name, p == 1 ? "one rank" : "two ranks: one message"};
    if (p < broadcast_scatter_min_ranks) return {tree::name, "p <= 4: at most 2 vectors on the tree's path"};
    if (bytes < broadcast_large_bytes) return {tree::name, "small message: latency-bound"};
    return {scatter_allgather::name, "large message: bandwidth-bound"};
}

// Over ranks in several nodes, several on a node (node_transport): the vector crosses the
// network once into each node (algorithm/hierarchical_broadcast.hpp), however the ranks are
// numbered; a flat tree's crossings depend on the numbering.
template <class Transport>
choice choose_broadcast_over(Transport& tp, std::size_t bytes) {
    if (spans_nodes(tp)) return {hierarchical::name, "ranks on several nodes, several on a node"};
    return choose_broadcast(tp.size(), bytes);
}

// Allgather, by the gathered size (p times the block): Bruck needs ceil(log2 p) messages to
// the ring's p - 1, for the same bytes (plus a local copy of the result). For p <= 3 both
// take as many rounds and the ring needs no scratch.
inline constexpr std::size_t allgather_small_bytes = 64 * 1024;

inline choice choose_allgather(rank_t p, std::size_t gathered_bytes) {
    if (p <= 3) return {ring::name, "p <= 3: as few rounds as bruck"};
    if (gathered_bytes <= allgather_small_bytes) return {bruck::name, "small message: latency-bound"};
    return {ring::name, "large message: bandwidth-bound"};
}

// Over nodes of equal sizes, several ranks on each (node_transport): each block crosses the
// network once into each node (algorithm/hierarchical_allgather.hpp).
template <class Transport>
choice choose_allgather_over(Transport& tp, std::size_t gathered_bytes) {
    if (spans_nodes(tp, true)) return {hierarchical::name, "equal nodes, several ranks on each"};
    return choose_allgather(tp.size(), gathered_bytes);
}

// Alltoall: pairwise keeps up to 8 rounds in flight (detail::pairwise_window), so below a
// few dozen ranks its latency is a few overlapped messages; Bruck's log2 p rounds are
// dependent and each block crosses up to log2 p links. Bruck only for many ranks and tiny
// blocks, where pairwise's p - 1 per-message costs dominate. Initial values, not measured
// (the test machines have too few cores for such groups).
inline constexpr rank_t alltoall_bruck_min_ranks = 32;
inline constexpr std::size_t alltoall_bruck_block_bytes = 256;

inline choice choose_alltoall(rank_t p, std::size_t block_bytes) {
    if (p >= alltoall_bruck_min_ranks && block_bytes <= alltoall_bruck_block_bytes)
        return {bruck::name, "many ranks, tiny blocks: log p rounds"};
    return {pairwise::name, "pairwise rounds in flight"};
}

// Over a transport whose ranks read each other's memory (direct_transport), a collective
// whose published block fits the transport's direct slot runs in one round (one_shot): one
// flag per peer instead of messages. The slot's size (shm_config::direct_bytes) is where the
// one round stops paying: measured in docs/algorithms.md.
// `unit_bytes`: what a round must hold at least (an element; alltoall and reduce_scatter: one
// of every block), also when the collective has no elements. A slot of 0 bytes: no one_shot.
// Over a transport whose ranks also read each other's buffers where they lie
// (exposing_transport), a block too large for the slot runs `Exposed` where the collective has
// one (void: none): two_shot for an allreduce (algorithm/two_shot_allreduce.hpp), zero_copy for
// broadcast, allgather, reduce_scatter and alltoall (algorithm/zero_copy_*.hpp): a few rounds,
// each byte read once from where it lies, where the message schedules copy every chunk twice
// (into the receiver's FIFO, then into place) behind a host round trip. `block_bytes` must be
// the same on every rank: the ranks must choose alike.
// A transport that exposes only registered memory (shm_transport: shm_buffer) says whether it
// holds any registration (the same on every rank); without one, an exposed round would only
// ever fall back, so the choices skip it.
template <class Transport>
bool exposes_now(Transport const& tp) noexcept {
    if constexpr (requires { tp.exposes(); }) return tp.exposes();
    else return true;
}

template <class T, class Exposed = void, class Transport>
choice prefer_direct(Transport& tp, std::size_t block_bytes, std::size_t unit_bytes, choice otherwise) {
    if constexpr (direct_transport<Transport>) {
        std::size_t const slot = tp.direct_bytes();
        if (direct_aligned<T>() && slot != 0 && block_bytes <= slot && unit_bytes <= slot)
            return {one_shot::name, "ranks read each other's memory: one round"};
    }
    if constexpr (!std::is_void_v<Exposed> && exposing_transport<Transport>) {
        if (direct_aligned<T>() && tp.size() > 1 && block_bytes > 0 && exposes_now(tp))
            return {Exposed::name, "ranks read each other's buffers where they lie"};
    }
    return otherwise;
}

/// The front doors' decision: the automatic choice, CHORUS_ALGO applied, logged. A bad
/// override fails the group like any invalid argument.
template <class Transport>
std::string_view decide(Transport& tp, std::string_view collective, std::size_t bytes, choice automatic_choice,
                        std::span<std::string_view const> allowed) {
    choice c = automatic_choice;
    try {
        c = apply_override(collective, automatic_choice, allowed);
    } catch (invalid_argument const& e) {
        tp.abort(e.what());
        throw;
    }
    log_choice(tp.rank(), tp.size(), collective, bytes, c);
    return c.algorithm;
}

} // namespace chorus::detail
