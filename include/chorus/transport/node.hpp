// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// node_transport: a job over several hosts (nodes) whose ranks of one host talk through shared
// memory and whose hosts talk over TCP. Every message goes the fastest way to its peer: to a
// rank of this node through the shm engine's rings (shm/engine.hpp), to any other over the TCP
// mesh (tcp/engine.hpp). So every collective and point-to-point call works over it unchanged,
// and the hierarchical algorithms (algorithm/hierarchical_{allreduce,broadcast,allgather}.hpp)
// that keep most bytes inside the nodes are chosen automatically for those collectives.
//
// Nodes: ranks that give the same node name share memory; the name is node_config::node
// (CHORUS_NODE), or the host's name. The ranks of one name must be on one host (one kernel, one
// PID namespace), or every rank throws at set-up naming two of them.
//
// Progress: a rank that waits on one engine drives the other (detail/companion.hpp), so the
// progress rule holds across both: a TCP send half written goes on while its writer waits for
// shared memory, and the other way round.
//
// Failure: one group, one failure. Whatever either engine finds (a local process died, a remote
// host went silent, a peer's abort) is spread to the other one — the TCP engine tells every
// remote rank, the shm engine writes it into every local rank's header — blaming the same rank,
// so every rank of every node names the rank that failed.
//
// Views: the ranks of this node (`local()`), and the ranks that have this rank's local rank on
// every node (`rail()`; rail 0 is the nodes' leaders): sub-groups of this transport with numbers
// of their own (detail/tags.hpp), made once at set-up, for the hierarchical algorithms.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>  // gethostname

#include <chorus/collectives.hpp>
#include <chorus/detail/companion.hpp>
#include <chorus/detail/env.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/fwd.hpp>
#include <chorus/group.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {

class node_transport;

/// How a node_transport joins: the TCP group of all ranks, the shared memory of each node, and
/// this rank's node name.
struct node_config {
    tcp_config tcp;
    shm_config shm;
    /// This rank's node: ranks with one name share memory. Empty: the host's name (gethostname).
    std::string node;
};

/// tcp_config_from_env, shm_config_from_env and CHORUS_NODE.
inline node_config node_config_from_env(char const* caller = "node_transport::config_from_env") {
    return {tcp_config_from_env(caller), shm_config_from_env(caller), detail::env_reader::get({"CHORUS_NODE"})};
}

namespace detail {

/// The transport of a node_transport: both engines, every message routed to the right one,
/// one failure. Pinned in memory (the engines' companions and the views point at it).
class node_mesh {
public:
    using memory_space = host_memory;

    /// A send or receive on either engine (the other handle is empty).
    class request {
    public:
        request() = default;
        request(tcp_transport::request t, shm_transport::request s, node_mesh* core) noexcept
            : tcp_(std::move(t)), shm_(std::move(s)), core_(core) {}
        void wait() {
            try {
                tcp_.wait();
                shm_.wait();
            } catch (...) {
                if (core_) core_->spread();
                throw;
            }
        }
        bool test() {
            try {
                return tcp_.test() && shm_.test();
            } catch (...) {
                if (core_) core_->spread();
                throw;
            }
        }

    private:
        tcp_transport::request tcp_;
        shm_transport::request shm_;
        node_mesh* core_ = nullptr;
    };

    /// What a sub-group inside one node exchanges directly through (chorus::split, chorus::group).
    using direct_group = shm_group_direct;

    node_mesh(tcp_transport world, shm_config const& shm, std::string node)
        : world_(std::move(world)), me_(world_.rank()), tcp_side_(this), shm_side_(this) {
        auto const p = static_cast<std::size_t>(world_.size());
        // Node names, by rank: the nodes in the order of their first ranks.
        if (node.empty()) node = host_name();
        std::array<char, 256> mine{};  // a hostname has at most 64 bytes, CHORUS_NODE more
        std::memcpy(mine.data(), node.data(), std::min(node.size(), mine.size() - 1));
        std::vector<char> names(mine.size() * p);
        chorus::allgather(world_, std::span<char const>(mine), names);
        node_of_.assign(p, -1);
        std::vector<std::size_t> first;  // a rank of each node
        std::vector<rank_t> count;
        local_rank_of_.assign(p, 0);
        for (std::size_t r = 0; r < p; ++r) {
            for (std::size_t n = 0; n < first.size(); ++n)
                if (std::memcmp(&names[r * mine.size()], &names[first[n] * mine.size()], mine.size()) == 0) node_of_[r] = static_cast<int>(n);
            if (node_of_[r] < 0) {
                node_of_[r] = static_cast<int>(first.size());
                first.push_back(r);
                count.push_back(0);
            }
            local_rank_of_[r] = count[static_cast<std::size_t>(node_of_[r])]++;
        }
        nodes_ = static_cast<rank_t>(first.size());
        equal_nodes_ = std::ranges::all_of(count, [&](rank_t c) { return c == count[0]; });
        for (std::size_t r = 0; r < p; ++r) {
            if (node_of_[r] == node_of_[static_cast<std::size_t>(me_)]) members_.push_back(static_cast<rank_t>(r));
            if (local_rank_of_[r] == local_rank()) rail_.push_back(static_cast<rank_t>(r));
        }
        try {
            shm_ = std::make_shared<shm_engine>(
                me_, world_.size(), shm,
                [&](std::span<std::byte const> own) {
                    std::vector<std::byte> all(own.size() * p);
                    chorus::allgather(world_, own, all);
                    return all;
                },
                members_);
        } catch (agreed_failure const&) {  // every rank throws it: leave the mesh, do not abort it
            { tcp_transport const leaving = std::move(world_); }
            throw;
        }
        // Each engine drives the other while it waits, where both carry messages.
        if (nodes_ > 1 && members_.size() > 1) {
            world_.engine_->set_companion(&shm_side_);
            shm_->set_companion(&tcp_side_);
        }
    }

    node_mesh(node_mesh const&) = delete;
    node_mesh& operator=(node_mesh const&) = delete;
    ~node_mesh() {
        spread();  // a failure only one engine knew of (a cancelled request) goes out as an abort on both
        if (world_.engine_) world_.engine_->set_companion(nullptr);
        if (shm_) shm_->set_companion(nullptr);
    }

    rank_t rank() const noexcept { return me_; }
    rank_t size() const noexcept { return world_.size(); }
    std::chrono::milliseconds timeout() const noexcept { return world_.timeout(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        try {
            if (is_local(peer)) return {{}, {shm_.get(), shm_->isend(peer, tag, bytes)}, this};
            return {world_.isend(peer, tag, bytes), {}, this};
        } catch (...) {
            spread();
            throw;
        }
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        try {
            if (is_local(peer)) return {{}, {shm_.get(), shm_->irecv(peer, tag, bytes)}, this};
            return {world_.irecv(peer, tag, bytes), {}, this};
        } catch (...) {
            spread();
            throw;
        }
    }
    std::uint64_t next_sequence() noexcept { return sequence_++; }
    void abort(char const* reason) noexcept {
        spread();
        world_.abort(reason);
        try {
            shm_->abort(me_, reason ? reason : "aborted");
        } catch (...) {
        }
    }

    /// The direct exchanges of sub-group `group` whose rank i is `members[i]` (group.hpp):
    /// slots of its own in this node's shared memory where every member is on this node; null
    /// where they span nodes (the same answer on every member: the nodes are) or the node's
    /// memory makes none. A failure of its rounds goes to both engines.
    template <class Allgather>
    std::shared_ptr<direct_group> open_direct_group(std::uint64_t group, std::vector<rank_t> members, Allgather&& allgather) {
        if (!std::ranges::all_of(members, [&](rank_t r) { return is_local(r); })) return nullptr;
        return direct_group::open(shm_, group, std::move(members), std::forward<Allgather>(allgather),
                                  [](void* core) noexcept { static_cast<node_mesh*>(core)->spread(); }, this);
    }

    /// The number of nodes, and this rank's node (0 .. nodes()-1, in the order of their first ranks).
    rank_t nodes() const noexcept { return nodes_; }
    rank_t node() const noexcept { return node_of(me_); }
    rank_t node_of(rank_t r) const noexcept { return node_of_[static_cast<std::size_t>(r)]; }
    /// This rank's index among the ranks of its node, and how many they are.
    rank_t local_rank() const noexcept { return local_rank_of(me_); }
    rank_t local_rank_of(rank_t r) const noexcept { return local_rank_of_[static_cast<std::size_t>(r)]; }
    rank_t local_size() const noexcept { return static_cast<rank_t>(members_.size()); }
    /// Whether this host's ranks (of every node named on it) outnumber the CPUs they may run on
    /// together: then a wait on shared memory yields its core at once instead of polling.
    bool oversubscribed() const noexcept { return shm_->oversubscribed(); }
    /// Whether every node has as many ranks (the rails then cover every rank).
    bool equal_nodes() const noexcept { return equal_nodes_; }
    /// The ring allreduce's segment (detail::ring_segment_bytes_of) over `members` (all ranks
    /// where empty): TCP's where they span nodes — a ring waits for its slowest link, and each of
    /// its messages then costs system calls on both ends — the default (shared memory) where
    /// they share one. The same on every rank: the nodes are.
    std::size_t ring_segment_bytes(std::span<rank_t const> members = {}) const noexcept {
        bool const across = members.empty() ? nodes_ > 1 : std::ranges::any_of(members, [&](rank_t r) { return node_of(r) != node_of(members[0]); });
        return across ? declared_ring_segment_bytes<tcp_transport>() : declared_ring_segment_bytes<shm_transport>();
    }
    /// The ranks of this node; the ranks of this local rank on every node (both in rank order).
    std::vector<rank_t> const& node_members() const noexcept { return members_; }
    std::vector<rank_t> const& rail_members() const noexcept { return rail_; }

protected:
    /// Leaves the TCP mesh without aborting it: set-up failed alike on every rank.
    void leave_agreed() noexcept { tcp_transport const leaving = std::move(world_); }

private:

    // The companion each engine pokes while it waits: one round of the other, then the
    // group's failure made one.
    struct tcp_side final : companion {
        explicit tcp_side(node_mesh* c) noexcept : core(c) {}
        void poke() override {
            try {
                core->world_.engine_->drive();
            } catch (std::exception const& e) {  // fails its own engine, not the loop of the other
                core->world_.engine_->fail(core->me_, e.what());
            } catch (...) {
                core->world_.engine_->fail(core->me_, "the TCP engine failed");
            }
            core->spread();
        }
        bool busy() const noexcept override { return core->world_.engine_->busy(); }
        node_mesh* core;
    };
    struct shm_side final : companion {
        explicit shm_side(node_mesh* c) noexcept : core(c) {}
        void poke() override {
            try {
                core->shm_->drive();
            } catch (std::exception const& e) {  // fails its own engine, not the loop of the other
                core->shm_->abort(core->me_, e.what());
            } catch (...) {
                core->shm_->abort(core->me_, "the shared-memory engine failed");
            }
            core->spread();
        }
        bool busy() const noexcept override { return core->shm_->busy(); }
        node_mesh* core;
    };

    bool is_local(rank_t peer) const noexcept {
        return peer >= 0 && peer < size() && node_of_[static_cast<std::size_t>(peer)] == node_of_[static_cast<std::size_t>(me_)];
    }

    // A failure one engine knows of is made the other's, blaming the same rank.
    void spread() noexcept {
        if (!shm_ || !world_.engine_) return;
        try {
            rank_t blamed = -1;
            std::string reason;
            if (world_.engine_->failure(blamed, reason)) {
                if (!shm_->failure().failed()) shm_->abort(blamed, reason);
            } else if (shm_->failure().failed()) {
                world_.engine_->fail(shm_->failure().blamed(), shm_->failure().reason());
            }
        } catch (...) {  // no memory for the reason's copy: each engine still fails its own waits
        }
    }

    static std::string host_name() {
        char buf[256]{};
        if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
        return buf;
    }

    tcp_transport world_;
    rank_t me_;
    rank_t nodes_ = 1;
    bool equal_nodes_ = true;
    std::vector<int> node_of_;
    std::vector<rank_t> local_rank_of_;
    std::vector<rank_t> members_, rail_;
    std::shared_ptr<shm_engine> shm_;  // shared: a sub-group's slots close only while it lives
    tcp_side tcp_side_;
    shm_side shm_side_;
    std::uint64_t sequence_ = 0;
};

/// A node_mesh with its views, for the hierarchical algorithms: the ranks of this node, and
/// rail i (local rank i of every node; rail 0: the nodes' leaders), sub-groups with numbers of
/// their own (detail/tags.hpp), made once, without a split. The node's view opens its direct
/// exchanges (two small exchanges inside the node), so its small phases run one_shot.
class node_core : public node_mesh {
public:
    node_core(tcp_transport world, shm_config const& shm, std::string node)
        : node_mesh(std::move(world), shm, std::move(node)),
          local_(*this, node_members(), local_rank(), node_local_group),
          rail_(*this, rail_members(), static_cast<rank_t>(std::ranges::find(rail_members(), rank()) - rail_members().begin()),
                node_rail_group) {
        // The node's ranks exchange small blocks through its memory (one_shot), every rank
        // agreeing whether every node could open its slots.
        try {
            open_direct_agreed(static_cast<node_mesh&>(*this), &local_);
        } catch (agreed_failure const&) {  // every rank throws it: leave the mesh, do not abort it
            leave_agreed();
            throw;
        }
    }

    group_transport<node_mesh>& local() noexcept { return local_; }
    group_transport<node_mesh>& rail() noexcept { return rail_; }

private:
    group_transport<node_mesh> local_, rail_;
};

} // namespace detail

/// One rank of a job over several hosts: shared memory to the ranks of its node, TCP to the
/// others. Move-only; one thread drives it (as with any transport).
class node_transport {
public:
    using memory_space = host_memory;
    using request = detail::node_mesh::request;
    /// What a sub-group inside one node exchanges directly through (chorus::split, chorus::group).
    using direct_group = detail::node_mesh::direct_group;

    /// Over `world` (every rank of the job, connected): each rank says its node's name (empty:
    /// the host's name) and the ranks of a name join in shared memory. A collective of world.
    explicit node_transport(tcp_transport world, shm_config const& shm = {}, std::string node = {})
        : core_(std::make_unique<detail::node_core>(std::move(world), shm, std::move(node))) {}
    explicit node_transport(node_config config)
        : node_transport(tcp_transport(std::move(config.tcp)), config.shm, std::move(config.node)) {}

    node_transport(node_transport&&) noexcept = default;
    node_transport& operator=(node_transport&& other) noexcept {
        if (this != &other) {
            leave();
            core_ = std::move(other.core_);
            unwinding_ = std::uncaught_exceptions();
        }
        return *this;
    }
    /// Leaves the group (both engines); destroyed while an exception unwinds, aborts it first.
    ~node_transport() { leave(); }

    /// node_config_from_env(): the launcher's variables, CHORUS_* settings and CHORUS_NODE.
    static node_config config_from_env() { return node_config_from_env(); }
    /// Joins the job a launcher (chorusrun, torchrun, srun, mpirun) started, on any number of hosts.
    static node_transport from_env() { return node_transport(node_config_from_env("node_transport::from_env")); }

    rank_t rank() const noexcept { return core_->rank(); }
    rank_t size() const noexcept { return core_->size(); }
    std::chrono::milliseconds timeout() const noexcept { return core_->timeout(); }
    rank_t nodes() const noexcept { return core_->nodes(); }
    rank_t node() const noexcept { return core_->node(); }
    rank_t local_rank() const noexcept { return core_->local_rank(); }
    rank_t local_size() const noexcept { return core_->local_size(); }
    /// Whether this host's ranks, of every node named on it, outnumber the CPUs they may run on
    /// together (shm_transport::oversubscribed).
    bool oversubscribed() const noexcept { return core_->oversubscribed(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) { return core_->isend(peer, tag, bytes); }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) { return core_->irecv(peer, tag, bytes); }
    std::uint64_t next_sequence() noexcept { return core_->next_sequence(); }
    void abort(char const* reason) noexcept {
        if (core_) core_->abort(reason);
    }

    /// The ring allreduce's segment over all ranks, or over `members` (a sub-group's): TCP's
    /// where they span nodes, shared memory's where they share one (node_mesh::ring_segment_bytes).
    std::size_t ring_segment_bytes(std::span<rank_t const> members = {}) const noexcept { return core_->ring_segment_bytes(members); }

    /// A sub-group's direct exchanges: slots of its own where its ranks share this node
    /// (node_mesh::open_direct_group; group.hpp calls it).
    template <class Allgather>
    std::shared_ptr<direct_group> open_direct_group(std::uint64_t group, std::vector<rank_t> members, Allgather&& allgather) {
        return core_->open_direct_group(group, std::move(members), std::forward<Allgather>(allgather));
    }

    /// The nodes and the views of them, for the hierarchical algorithms.
    detail::node_core& hierarchy() noexcept { return *core_; }

private:
    void leave() noexcept {
        if (core_ && std::uncaught_exceptions() > unwinding_) {
            try {
                core_->abort(detail::left_by_exception_message(core_->rank()).c_str());
            } catch (...) {
            }
        }
        core_.reset();
    }

    std::unique_ptr<detail::node_core> core_;
    int unwinding_ = std::uncaught_exceptions();
};

} // namespace chorus
