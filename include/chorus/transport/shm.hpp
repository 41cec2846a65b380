// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// shm_transport: the ranks of one host, one process each, exchanging messages through shared
// memory (Linux): a lock-free ring per pair of ranks, large messages in pipelined parts, or,
// from 64 KiB (CHORUS_SHM_REMOTE_BYTES) where the sender is receiving too, copied once by the
// kernel from the sender's buffer into the receiver's (process_vm_readv). The engine and its protocol: shm/engine.hpp; the memory:
// shm/segment.hpp.
//
// Joining: the ranks find each other over another transport (the bootstrap) that carries two
// small exchanges; from_env() uses tcp_transport over the launcher's variables (chorusrun,
// torchrun, srun, mpirun: the same as tcp_transport::from_env), so the same job starts over
// either transport. Every rank must be on one host; otherwise every rank throws
// invalid_argument, naming two ranks that are not.
//
// Failure: as for every transport (docs/concepts.md#transport) — a rank whose process dies is
// named by every rank within 10 ms of their next wait; an abort reaches every rank at once; a
// rank that leaves fails what the others still wait for from it. Nothing is left behind in
// /dev/shm, whatever happens: the segments never have a name.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <chorus/collectives.hpp>
#include <chorus/detail/env.hpp>
#include <chorus/detail/request_handle.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/shm/engine.hpp>
#include <chorus/transport/shm/exposure.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {

/// The CHORUS_* settings of a shared-memory group (shm_config's fields name them).
inline shm_config shm_config_from_env(char const* caller = "shm_transport::config_from_env") {
    detail::env_reader const env(caller);
    shm_config c;
    c.timeout = std::chrono::milliseconds(env.number_at_least("CHORUS_TIMEOUT_MS", 0, c.timeout.count()));
    c.spin = std::chrono::microseconds(env.number_at_least("CHORUS_SPIN_US", 0, c.spin.count()));
    c.ring_bytes = static_cast<std::size_t>(
        env.number_at_least("CHORUS_SHM_RING_BYTES", 4096, static_cast<long long>(c.ring_bytes)));
    if (c.ring_bytes % 4096 != 0) env.fail("CHORUS_SHM_RING_BYTES must be a multiple of 4096: " + std::to_string(c.ring_bytes));
    c.stopped_limit = std::chrono::milliseconds(5 * env.number_at_least("CHORUS_HEARTBEAT_MS", 0, c.stopped_limit.count() / 5));
    if (std::string fd = env.get({"CHORUS_BLAME_FD"}); !fd.empty()) c.blame_fd = static_cast<int>(env.number(fd, "CHORUS_BLAME_FD"));
    c.direct_bytes = static_cast<std::size_t>(
        env.number_at_least("CHORUS_SHM_DIRECT_BYTES", 0, static_cast<long long>(c.direct_bytes)));
    c.remote_bytes = static_cast<std::size_t>(
        env.number_at_least("CHORUS_SHM_REMOTE_BYTES", 0, static_cast<long long>(c.remote_bytes)));
    return c;
}

namespace detail {

/// A sub-group's direct exchanges over shm_transport (chorus::split, chorus::group): slots of
/// its own in the engine (shm_engine::open_area), so that the sub-group's small collectives
/// take the one_shot schedules as the whole group's do. Closed with the last copy of the group
/// (where the engine is still there: a group destroyed after its transport closes nothing).
class shm_group_direct {
public:
    /// A failure of the sub-group's rounds is the engine's; `spread`, where not null, is called
    /// with `owner` before it is thrown (node_transport: it is made the TCP engine's too).
    shm_group_direct(std::shared_ptr<shm_engine> const& engine, std::uint64_t group, shm::direct_area& area,
                     void (*spread)(void*) noexcept = nullptr, void* owner = nullptr) noexcept
        : engine_(engine.get()), alive_(engine), group_(group), area_(&area), spread_(spread), owner_(owner) {}
    shm_group_direct(shm_group_direct const&) = delete;
    shm_group_direct& operator=(shm_group_direct const&) = delete;
    ~shm_group_direct() {
        if (auto const engine = alive_.lock()) engine->close_area(group_);
    }

    /// Opens sub-group `group`'s direct exchanges in `engine` (shm_engine::open_area): null
    /// where the engine makes none (direct_bytes 0, the same on every rank).
    template <class Allgather>
    static std::shared_ptr<shm_group_direct> open(std::shared_ptr<shm_engine> const& engine, std::uint64_t group, std::vector<rank_t> members,
                                                  Allgather&& allgather, void (*spread)(void*) noexcept = nullptr, void* owner = nullptr) {
        if (engine->area_bytes() == 0) return nullptr;
        auto& area = engine->open_area(group, std::move(members), std::forward<Allgather>(allgather));
        try {
            return std::make_shared<shm_group_direct>(engine, group, area, spread, owner);
        } catch (...) {
            engine->close_area(group);
            throw;
        }
    }

    std::size_t direct_bytes() const noexcept { return area_->direct_bytes; }
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from) {
        try {
            engine_->exchange(*area_, pieces, agreed, tag, from);
        } catch (...) {
            if (spread_) spread_(owner_);
            throw;
        }
    }
    bool await_round() {
        try {
            return engine_->await_round(*area_);
        } catch (...) {
            if (spread_) spread_(owner_);
            throw;
        }
    }
    std::span<std::byte const> block(rank_t r) const noexcept { return shm_engine::block(*area_, r); }
    std::uint64_t agreed(rank_t r) const noexcept { return shm_engine::agreed(*area_, r); }

private:
    shm_engine* engine_;
    std::weak_ptr<shm_engine> alive_;
    std::uint64_t group_;
    shm::direct_area* area_;
    void (*spread_)(void*) noexcept;
    void* owner_;
};

} // namespace detail

/// One rank of a shared-memory group. Move-only; one thread drives it (as with any transport).
class shm_transport {
public:
    using memory_space = host_memory;
    using request = detail::request_handle<detail::shm_engine, detail::shm_op>;
    /// What a sub-group of it exchanges directly through (chorus::split, chorus::group).
    using direct_group = detail::shm_group_direct;

    /// Joins the ranks of `bootstrap` (every rank calls this, as a collective of bootstrap,
    /// which is not used afterwards and may be destroyed). Blocks until every rank mapped
    /// every segment.
    template <host_transport Bootstrap>
    explicit shm_transport(Bootstrap& bootstrap, shm_config config = {})
        : local_rank_(local_rank_of(bootstrap)),
          engine_(std::make_shared<detail::shm_engine>(bootstrap.rank(), bootstrap.size(), config,
                                                       [&](std::span<std::byte const> mine) {
                                                           std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(bootstrap.size()));
                                                           chorus::allgather(bootstrap, mine, all);
                                                           return all;
                                                       })) {}

    shm_transport(shm_transport&& other) noexcept = default;
    shm_transport& operator=(shm_transport&& other) noexcept {
        if (this != &other) {
            leave();
            local_rank_ = other.local_rank_;
            sequence_ = other.sequence_;
            exposures_ = std::move(other.exposures_);
            engine_ = std::move(other.engine_);
            unwinding_ = std::uncaught_exceptions();
        }
        return *this;
    }

    /// Leaves the group (peers' waits for this rank fail naming it); destroyed by an exception
    /// unwinding the stack, it aborts the group with that said, as tcp_transport does.
    ~shm_transport() { leave(); }

    /// shm_config_from_env(): the CHORUS_* settings.
    static shm_config config_from_env() { return shm_config_from_env(); }

    /// Joins the job a launcher (chorusrun, torchrun, srun, mpirun) started on this host: the
    /// ranks meet over tcp_transport::from_env()'s variables, then talk through memory.
    static shm_transport from_env() {
        shm_config const config = shm_config_from_env("shm_transport::from_env");
        return over(tcp_transport(tcp_config_from_env("shm_transport::from_env")), config);
    }

    /// Joins the ranks of `bootstrap` (moved from), then leaves it as a program's end does:
    /// its ranks meet there once. When joining fails alike on every rank (not on one host,
    /// settings that differ) each throws, and the bootstrap is left, not aborted.
    static shm_transport over(tcp_transport&& bootstrap, shm_config config) {
        tcp_transport tcp = std::move(bootstrap);
        try {
            return shm_transport(tcp, config);
        } catch (detail::agreed_failure const&) {  // every rank throws it: leave, do not abort
            { tcp_transport const leaving = std::move(tcp); }
            throw;
        }
    }

    rank_t rank() const noexcept { return engine_->rank(); }
    rank_t size() const noexcept { return engine_->size(); }
    rank_t local_rank() const noexcept { return local_rank_; }
    std::chrono::milliseconds timeout() const noexcept { return engine_->timeout(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return {engine_.get(), engine_->isend(peer, tag, bytes)};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return {engine_.get(), engine_->irecv(peer, tag, bytes)};
    }
    std::uint64_t next_sequence() noexcept { return sequence_++; }

    // direct_transport (transport/concepts.hpp): the blocks of one_shot collectives.
    std::size_t direct_bytes() const noexcept { return engine_->direct_bytes(); }
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag) {
        exposures_.end_round();
        engine_->exchange(pieces, agreed, tag);
    }
    // rooted_transport: a round that waits for one rank's block (a broadcast's root's).
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from) {
        exposures_.end_round();
        engine_->exchange(pieces, agreed, tag, from);
    }

    // exposing_transport and registering_transport: the peers read a buffer where it lies
    // when it is inside a registered shm_buffer on every rank (shm/exposure.hpp); any other
    // buffer's round returns false on every rank, and the collective sends messages.
    bool expose(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag) {
        return exposures_.expose(*engine_, buffer, {}, agreed, tag);
    }
    bool expose(std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts, std::uint64_t agreed, tag_t tag) {
        return exposures_.expose(*engine_, buffer, parts, agreed, tag);
    }
    std::uint64_t keep(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag) {
        return exposures_.keep(*engine_, buffer, agreed, tag);
    }
    void release(std::uint64_t registration, std::uint64_t agreed, tag_t tag) { exposures_.release(*engine_, registration, agreed, tag); }
    // putting_transport: the peers' registered allocations are mapped writable.
    bool exposable(std::span<std::byte const> buffer) const { return exposures_.exposable(buffer); }
    std::span<std::byte> put_block(rank_t r) const noexcept {
        return exposures_.active() ? exposures_.put_block(r) : std::span<std::byte>();
    }
    /// Whether some buffer is registered (the same on every rank): the automatic choices try
    /// the exposed schedules (zero_copy, two_shot) only then, so that a program that
    /// registers nothing pays no round for them.
    bool exposes() const noexcept { return exposures_.exposes(); }
    /// Rounds so far in which the peers read every rank's buffer where it lies (a program can
    /// tell its registrations serve its collectives: zero_copy and two_shot take one or two
    /// such rounds each).
    std::uint64_t exposed_rounds() const noexcept { return exposures_.exposed_rounds(); }
    bool await_round() { return engine_->await_round(); }

    /// Whether `peer` reads this rank's large messages from its memory (process_vm_readv,
    /// probed when joining; false where a container's seccomp filter or a ptrace policy refuses
    /// it, or remote_bytes is 0): then a message of remote_bytes or more, sent while this rank
    /// is receiving too, goes remote (shm_config::remote_bytes).
    bool reads_remote(rank_t peer) const noexcept { return engine_->reads_remote(peer); }
    /// Whether the ranks of this host outnumber the CPUs they may run on together (the union
    /// of their affinity masks; every rank of the group on this host, also those of other
    /// nodes of a node_transport): then a wait yields its core at once instead of polling.
    bool oversubscribed() const noexcept { return engine_->oversubscribed(); }
    std::span<std::byte const> block(rank_t r) const noexcept {
        return exposures_.active() ? exposures_.block(r) : engine_->block(r);
    }
    std::uint64_t agreed(rank_t r) const noexcept { return engine_->agreed(r); }
    /// The direct exchanges of sub-group `group` whose rank i is this transport's `members[i]`
    /// (group.hpp, when a split or group makes it): every rank of the sub-group calls it, and
    /// `allgather` is an allgather of bytes over the sub-group's messages. Null where this
    /// transport makes no direct exchanges (direct_bytes 0: the same on every rank).
    template <class Allgather>
    std::shared_ptr<direct_group> open_direct_group(std::uint64_t group, std::vector<rank_t> members, Allgather&& allgather) {
        return direct_group::open(engine_, group, std::move(members), std::forward<Allgather>(allgather));
    }

    void abort(char const* reason) noexcept {
        try {
            if (engine_) engine_->abort(rank(), reason ? reason : "aborted");
        } catch (...) {  // the reason's copy failed to allocate
        }
    }

private:
    template <class Bootstrap>
    static rank_t local_rank_of(Bootstrap const& b) noexcept {
        if constexpr (requires { b.local_rank(); }) return b.local_rank();
        else return b.rank();
    }

    void leave() noexcept {
        if (engine_ && std::uncaught_exceptions() > unwinding_) {
            try {
                engine_->abort(engine_->rank(), detail::left_by_exception_message(engine_->rank()));
            } catch (...) {
            }
        }
        exposures_ = {};
        engine_.reset();
    }

    rank_t local_rank_ = 0;
    std::uint64_t sequence_ = 0;
    detail::shm_exposures exposures_;
    std::shared_ptr<detail::shm_engine> engine_;  // shared: a sub-group's slots close only while it lives
    int unwinding_ = std::uncaught_exceptions();
};

} // namespace chorus
