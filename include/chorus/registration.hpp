// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Registered buffers (registering_transport: CUDA IPC; shm_transport, for shm_buffer memory): a buffer that every peer keeps open
// across collectives, as NCCL's ncclCommRegister and PyTorch's symmetric memory do. Without a
// registration, each collective that reads buffers where they lie (two_shot, zero_copy) looks
// up and exports each rank's allocation and each peer opens it, then closes it before the call
// returns (cudaIpcOpenMemHandle and cudaIpcCloseMemHandle per peer and call: CUDA forbids
// freeing memory a peer still has open, and the caller may free its buffer once the call
// returned). A registration moves that cost to register_buffer, once: collectives on any range
// inside the buffer then expose it by its registration, with neither query nor open.
//
//   auto reg = chorus::register_buffer(tp, weights);   // every rank, its own buffer
//   for (...) chorus::allreduce(tp, weights);            // no export, no open
//   chorus::deregister_buffer(tp, reg);                  // every rank; then it may free it
//
// Both calls are collective (every rank calls them in the same order as its collectives). A
// buffer must stay allocated until deregister_buffer returned on its rank; destroying the
// transport ends every registration too.

#include <cstdint>
#include <span>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/algorithm/detail/direct.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

/// What register_buffer made: a number the same on every rank, or none (kept() false) where
/// some rank's buffer could not be exported (CUDA: memory from a stream-ordered pool, from
/// cuMemCreate, host memory); the collectives then run as without it.
class registration {
public:
    registration() = default;
    bool kept() const noexcept { return number_ != 0; }
    std::uint64_t number() const noexcept { return number_; }

private:
    template <registering_transport Transport, message_range R>
    friend registration register_buffer(Transport&, R const&);
    explicit registration(std::uint64_t number) noexcept : number_(number) {}
    std::uint64_t number_ = 0;
};

/// Registers `buffer` with every peer (collective: every rank its own buffer, of any size, empty
/// included).
template <registering_transport Transport, message_range R>
[[nodiscard]] registration register_buffer(Transport& tp, R const& buffer) {
    detail::direct_rounds round(tp, detail::collective_kind::register_buffer, 0);
    return registration(round.keep(detail::bytes_of(detail::to_const_span(buffer))));
}

/// Ends a registration (collective: every rank passes the one its register_buffer returned);
/// once it returned, this rank may free its buffer. Ranks that end different registrations fail
/// alike, naming them.
template <registering_transport Transport>
void deregister_buffer(Transport& tp, registration const& r) {
    // The number travels in the round's shape: every rank checks that all end the same one.
    detail::direct_rounds round(tp, detail::collective_kind::deregister_buffer, r.number());
    round.release(r.number());
}

} // namespace chorus
