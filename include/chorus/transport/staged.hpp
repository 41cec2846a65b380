// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// staged_transport<Device, Control>: a transport whose messages move through FIFOs in the
// receiver's memory, copied by a device (a staged_device), with a control channel (a
// control_transport) for chunk headers and credits. The protocol: staged/protocol.hpp; the
// engine: staged/engine.hpp. cuda_ipc_transport is staged_transport<cuda_ipc_device,
// shm_transport>; the tests run it over a host model of a device and over loopback or shared
// memory.
//
// With staged_config::direct_bytes it is a direct_transport too: blocks of the one_shot
// collectives are copied into a slot of the rank's own memory and read by the peers where
// they lie (protocol.hpp). Where the device exports a caller's memory it is an
// exposing_transport: the peers read the caller's buffer itself (two_shot, zero_copy), and
// large messages go by rendezvous (staged_config::rendezvous_bytes): the receiver copies them
// once, from the sender's buffer.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <chorus/detail/request_handle.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/staged/engine.hpp>
#include <chorus/transport/staged/protocol.hpp>

namespace chorus {

template <staged_device Device, control_transport Control>
class staged_transport {
public:
    using memory_space = typename Device::memory_space;
    using engine = detail::staged_engine<Device, Control>;
    using device_type = Device;
    using request = detail::request_handle<engine, detail::staged_op>;

    /// Over a connected control channel with no messages in flight (the engine uses its tags 1,
    /// 2 and 3); starts the exchange of FIFO handles, which completes in the first operations'
    /// progress (their timeout bounds it). An rvalue reference, not a value: `control` is
    /// moved from only once every argument was evaluated.
    staged_transport(Control&& control, staged_config config, Device device)
        : engine_(std::make_unique<engine>(std::move(control), config, std::move(device))) {}

    rank_t rank() const noexcept { return engine_->rank(); }
    rank_t size() const noexcept { return engine_->size(); }
    rank_t local_rank() const noexcept { return engine_->local_rank(); }
    std::chrono::milliseconds timeout() const noexcept { return engine_->timeout(); }
    Device& device() noexcept { return engine_->device(); }
    /// The control channel, a host-memory transport of the same ranks. Its own collectives may
    /// run on it (chorus::split does) as long as every rank calls them in the same order.
    Control& control() noexcept { return engine_->control(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return {engine_.get(), engine_->isend(peer, tag, bytes)};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return {engine_.get(), engine_->irecv(peer, tag, bytes)};
    }
    std::uint64_t next_sequence() noexcept { return engine_->next_sequence(); }

    /// The direct exchange (transport/concepts.hpp, direct_transport): blocks of up to
    /// direct_bytes() in device memory, read by the peers in place; direct_bytes() 0: none.
    std::size_t direct_bytes() const noexcept { return engine_->direct_bytes(); }
    /// Messages to another rank of at least this many bytes go by rendezvous where the device
    /// exports their memory (staged_config::rendezvous_bytes); 0: none.
    std::size_t rendezvous_bytes() const noexcept { return engine_->rendezvous_bytes(); }
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag) {
        engine_->exchange(pieces, agreed, tag);
    }
    std::span<std::byte const> block(rank_t r) const noexcept { return engine_->block(r); }
    /// A round whose block is the caller's buffer itself (exposing_transport), where the device
    /// exports memory (Device::export_range).
    bool expose(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag)
        requires engine::can_expose
    {
        return engine_->expose(buffer, agreed, tag);
    }
    bool expose(std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts, std::uint64_t agreed, tag_t tag)
        requires engine::can_expose
    {
        return engine_->expose(buffer, parts, agreed, tag);
    }
    /// Registrations (registering_transport): a buffer every peer keeps open across collectives.
    std::uint64_t keep(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag)
        requires engine::can_expose
    {
        return engine_->keep(buffer, agreed, tag);
    }
    void release(std::uint64_t registration, std::uint64_t agreed, tag_t tag)
        requires engine::can_expose
    {
        engine_->release_registration(registration, agreed, tag);
    }
    std::uint64_t agreed(rank_t r) const noexcept { return engine_->agreed(r); }
    /// Signaled launches (signaling_transport), where the device runs them.
    std::size_t signal_bytes()
        requires engine::can_signal
    {
        return engine_->signal_bytes();
    }
    template <class Body>
    void launch(Body const& body, std::size_t bytes, std::uint64_t shape, std::string (*describe)(std::uint64_t))
        requires engine::can_signal
    {
        engine_->launch(body, bytes, shape, describe);
    }
    /// Throws if a signaled launch failed on the device by now (or the group failed before).
    void check_launches()
        requires engine::can_signal
    {
        engine_->check_launches();
    }
    void abort(char const* reason) noexcept {
        try {
            engine_->abort(reason ? reason : "aborted");
        } catch (...) {  // the reason's copy failed to allocate: the group stays as it was
        }
    }

private:
    std::unique_ptr<engine> engine_;
};

} // namespace chorus
