// SPDX-License-Identifier: MIT
#pragma once

// The smallest models of the concepts. Instantiating every algorithm with them proves the
// algorithms use nothing beyond what the concepts require (the request is move-only, the
// transport has no members but the concept's). Never run: bodies are placeholders.

#include <chorus/chorus.hpp>

#include <cstdint>
#include <span>

namespace archetypes {

struct request {
    request() = default;
    request(request&&) = default;
    request& operator=(request&&) = default;
    request(request const&) = delete;
    request& operator=(request const&) = delete;
    void wait() {}
    bool test() { return true; }
};

struct transport {
    using memory_space = chorus::host_memory;
    using request = archetypes::request;
    chorus::rank_t rank() const noexcept { return 0; }
    chorus::rank_t size() const noexcept { return 1; }
    request isend(chorus::rank_t, chorus::tag_t, std::span<std::byte const>) { return {}; }
    request irecv(chorus::rank_t, chorus::tag_t, std::span<std::byte>) { return {}; }
    std::uint64_t next_sequence() { return 0; }
    void abort(char const*) noexcept {}
};

struct topology {
    chorus::rank_t size() const noexcept { return 1; }
    chorus::rank_list neighbours(chorus::rank_t) const { return {}; }
};

struct tree_topology : topology {
    chorus::rank_t root() const noexcept { return 0; }
    chorus::rank_list parents(chorus::rank_t) const { return {}; }
    chorus::rank_list children(chorus::rank_t) const { return {}; }
};

/// A reduce_op and nothing more: not commutative, no identity.
struct reduce_op {
    template <class T>
    T operator()(T const& a, T const&) const noexcept {
        return a;
    }
};

} // namespace archetypes
