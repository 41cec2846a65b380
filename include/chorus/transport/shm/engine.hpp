// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// shm_transport's engine: messages between the processes of one host through shared memory
// (segment.hpp), matched by the core every transport shares (detail/matching.hpp).
//
// Paths. A message is copied into the receiver's ring from this sender (a single-producer
// single-consumer ring, lock-free: the sender moves head, the receiver tail) in parts of at
// most a quarter of the ring, and copied out by the receiver: two copies, pipelined, on two
// cores, through memory that stays in cache. A message of shm_config::remote_bytes or more,
// from a rank that is receiving too, is instead announced by a `remote` record carrying its
// address, and the receiver copies it straight from the sender's memory into its own buffer
// with process_vm_readv (cross-memory attach: one copy, made by the kernel); its `ack` record
// completes the send. A remote message that no receive matched within the spin is read into
// a buffer by the receiver's next progress (buffer_remotes), so sends complete without their
// receives as over the rings. Pairs where that read is refused (a container's seccomp filter, a hardened
// ptrace policy; probed at set-up) use the ring for everything.
//
// Direct exchanges (exchange(), for the one_shot collectives: transport/concepts.hpp,
// direct_transport). Every rank writes its block into a slot of its own segment and stamps it
// with the round's number; every rank then reads its peers' blocks where they are, in their
// segments. A small block travels in the cache line that announces it: an 8-byte allreduce of
// two ranks costs each rank one line written and one line read, against a ring's record out,
// record in, and the matching of a receive. A sub-group (group.hpp) exchanges the same way in
// slots of its own (open_area: a small segment per member, keyed by the group's number), so its
// rounds never meet the whole group's or another group's.
//
// Progress, in the caller's thread, as for TCP: isend writes what fits at once; every wait()
// and test() drains every ring into posted receives (or the unexpected queue) and pushes every
// queued send, so the progress rule holds whatever order the ranks post in.
//
// Waiting. A waiter polls for shm_config::spin (with pause; on a host whose ranks outnumber
// their CPUs, sched_yield instead, so that a rank that has work gets the core), then sleeps on
// its doorbell, a futex in its header: a writer that sees the `sleeping` flag bumps the
// doorbell and wakes it. Spinning first because a futex wake-up on an idle core costs tens of
// microseconds, a hundred times a small message's trip through a ring.
//
// Failure. The group's failure is written into every rank's header (the first writer wins
// there) and wakes every rank: an abort reaches the others in the time of a cache miss. A
// sleeping waiter checks every slice (10 ms) whether a peer's process exited (pidfd) without
// leaving — it is then blamed by the whole group — and whether the peer its request waits for
// left the group (its header's `left`, set by its transport's destructor). Every wait is
// bounded by shm_config::timeout.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <sched.h>

#include <chorus/detail/companion.hpp>
#include <chorus/detail/matching.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/shm/segment.hpp>

namespace chorus {

/// What a shared-memory group needs beyond its ranks (shm_transport::config_from_env reads
/// the CHORUS_* variables named here).
struct shm_config {
    /// Bounds every wait of a send or receive (CHORUS_TIMEOUT_MS); 0: unbounded.
    std::chrono::milliseconds timeout{30000};
    /// Bytes of each ring, one per sender in every receiver's segment (CHORUS_SHM_RING_BYTES;
    /// a multiple of 4096, at least 4096): a segment holds size() rings.
    std::size_t ring_bytes = 256 * 1024;
    /// Messages of at least this many bytes, sent by a rank that is itself receiving (an
    /// exchange, a ring's step), are read from the sender's memory in one copy
    /// (CHORUS_SHM_REMOTE_BYTES); 0: never, every message goes through the rings. A rank that
    /// only sends uses the rings, whose two copies share the work between two cores. Measured
    /// on the 2-core CI VM (docs/algorithms.md#shared-memory-shm_transport): 1.2-1.8x faster
    /// than the rings for 1-64 MiB alltoall, allgather and reduce_scatter, 1.1-1.7x for
    /// allreduce; no slower from 64 KiB.
    std::size_t remote_bytes = 64 * 1024;
    /// The largest block a rank publishes in one direct exchange (CHORUS_SHM_DIRECT_BYTES):
    /// one_shot collectives up to this size; each rank's segment holds two slots of it. 0: no
    /// direct exchanges. Measured crossover with the ring algorithms: docs/algorithms.md.
    std::size_t direct_bytes = 16 * 1024;
    /// How long a wait polls before it sleeps (CHORUS_SPIN_US).
    std::chrono::microseconds spin{50};
    /// A peer whose process stays stopped (SIGSTOP, a debugger) this long while this rank waits
    /// is blamed by the group (five times CHORUS_HEARTBEAT_MS, TCP's limit of silence); 0: never.
    std::chrono::milliseconds stopped_limit{5000};
    /// Where to report whom this rank blames when its group fails (CHORUS_BLAME_FD; see
    /// tcp_config::blame_fd). -1: nowhere.
    int blame_fd = -1;
};

namespace detail::shm {

struct shm_op : message_op {
    std::byte const* out = nullptr;
    std::byte* in = nullptr;
    std::size_t offset = 0;  // send: payload bytes written; receive: bytes arrived
    std::uint64_t id = 0;    // a remote send's number (its ack names it); a remote receive's, to ack
    std::uint64_t addr = 0;  // a remote receive's: where the message lies in the sender's memory
    bool started = false;    // a send whose first record is written
    bool remote = false;     // a send the peer reads from this rank's memory (goes_remote)
    bool direct = false;     // not a message: exchange() waiting for the peer's block ...
    direct_slot const* awaited = nullptr;  // ... in this slot
    std::uint64_t round = 0;               // ... of this round
};

/// A message that arrived before its receive: its bytes (as far as they came), or where to
/// read it from.
struct shm_unexpected {
    tag_t tag = 0;
    std::size_t size = 0;
    host_memory::buffer<std::byte> bytes;  // reused from message to message when large
    std::size_t filled = 0;
    bool remote = false;
    std::uint64_t addr = 0, id = 0;
    std::chrono::steady_clock::time_point arrived{};  // a remote one's record
    bool complete() const noexcept { return remote || filled == size; }
};

/// The direct exchanges of one set of ranks: where their slots are, and this rank's rounds.
/// The whole group's slots lie in every rank's segment (layout::slot); a sub-group's in a
/// segment of two slots that each of its ranks makes for it (shm_engine::open_area), so that
/// the group's rounds and the sub-group's never share a slot. Indices are the set's own ranks
/// (a sub-group's); `ranks` maps them to the engine's, which errors name.
struct direct_area {
    std::vector<rank_t> ranks;        // empty: no direct exchanges (a group that spans hosts)
    std::vector<std::byte*> slots;    // index i's first slot
    std::vector<mapping> maps;        // a sub-group's segments, by index (this rank's own included)
    std::size_t self = 0;             // this rank's index
    std::size_t stride = 0;           // from a rank's first slot to its second
    std::size_t direct_bytes = 0;
    std::uint64_t round = 0;          // this rank's latest
    std::uint64_t settled = 0;        // the latest every rank is known to have published
    tag_t round_tag = 0;              // the collective of `round`
    bool round_in_place = false;      // `round` is an exposure's

    std::size_t size() const noexcept { return ranks.size(); }
    direct_slot* slot(std::size_t i, std::uint64_t r) const noexcept {
        return reinterpret_cast<direct_slot*>(slots[i] + (r % 2) * stride);
    }
    /// The index of the engine's rank r; size() where it is not one of the set.
    std::size_t index_of(rank_t r) const noexcept { return static_cast<std::size_t>(std::ranges::find(ranks, r) - ranks.begin()); }
};

class shm_engine {
public:
    using op_ptr = std::shared_ptr<shm_op>;

    /// Collective over the ranks: `allgather(bytes)` returns every rank's `bytes` (same size on
    /// every rank), by rank, over some other transport (the bootstrap). `members`: the ranks
    /// this rank shares memory with (sorted, itself included; empty: all), for a group that
    /// spans hosts (node_transport): only they get rings and segments, messages keep the
    /// group's rank numbers, and the others are never sent to.
    template <class Allgather>
    shm_engine(rank_t me, rank_t size, shm_config const& config, Allgather&& allgather, std::vector<rank_t> const& members = {})
        : me_(me), timeout_(config.timeout), spin_(config.spin), slot_(slots_of(size, members)),
          layout_{config.ring_bytes, static_cast<std::size_t>(std::ranges::count_if(slot_, [](std::int32_t x) { return x >= 0; })),
                  config.direct_bytes},
          remote_bytes_(config.remote_bytes), part_bytes_(config.ring_bytes / 4), stopped_limit_(config.stopped_limit),
          blame_fd_(config.blame_fd), peers_(static_cast<std::size_t>(size)) {
        if (config.ring_bytes < 4096 || config.ring_bytes % 4096 != 0)
            throw invalid_argument("shm_transport: ring_bytes must be a positive multiple of 4096, got " +
                                   std::to_string(config.ring_bytes));
        set_up(std::forward<Allgather>(allgather));
    }

    shm_engine(shm_engine const&) = delete;
    shm_engine& operator=(shm_engine const&) = delete;

    /// Leaves the group: peers waiting for this rank fail naming it. The segments stay mapped
    /// by whoever still uses them.
    ~shm_engine() {
        if (own_ == nullptr) return;
        own_->left.store(1, std::memory_order_release);
        for (auto& q : peers_)
            if (q.header) ring_doorbell(*q.header, /*always=*/true);
    }

    rank_t rank() const noexcept { return me_; }
    rank_t size() const noexcept { return static_cast<rank_t>(peers_.size()); }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// The largest block of a direct exchange; 0: none (a group that spans hosts).
    std::size_t direct_bytes() const noexcept { return whole_.direct_bytes; }

    /// One round of the direct exchange: publishes this rank's block, the concatenation of
    /// `pieces` (at most direct_bytes() in all), with the word `agreed`, and returns once every
    /// rank published its block of this round; `block(r)` and `agreed(r)` then show rank r's
    /// until this rank's next round. Waits as wait() does (moving messages meanwhile), bounded
    /// by the timeout, and fails as a receive of `tag` from the rank it waits for would.
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag) {
        exchange(pieces, agreed, tag, -1);
    }

    /// A round that returns once rank `from`'s block is readable (rooted_transport): at once
    /// where `from` is this rank; every rank where it is -1. The next round first waits for
    /// the ranks not waited for (await_round): a rank writes over its slot of round k only once
    /// every peer published round k + 1, so done reading round k.
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from) {
        publish_round(whole_, pieces, agreed, tag, from, false);
    }

    /// A round of every rank whose block is a record of a buffer read where it lies
    /// (shm/exposure.hpp): a peer that publishes a copy in the same round instead fails both.
    void exchange_in_place(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag) {
        publish_round(whole_, pieces, agreed, tag, -1, true);
    }

    /// The direct exchanges of sub-group `group` (its number in tags, detail/tags.hpp), whose
    /// rank i is this engine's `ranks[i]`: a round of it publishes and reads slots of its own,
    /// made here, so its rounds and the whole group's (or another sub-group's) never meet. Every
    /// rank of the sub-group calls it; `allgather(bytes)` returns every rank's `bytes`, by
    /// sub-group rank (over the sub-group's messages). A rank that cannot make or map the slots
    /// says why, and every rank throws that. Open until close_area(group).
    template <class Allgather>
    direct_area& open_area(std::uint64_t group, std::vector<rank_t> ranks, Allgather&& allgather) {
        throw_if_failed();
        if (areas_.contains(group)) throw invalid_argument("shm_transport: the direct exchanges of group " + std::to_string(group) + " are open already");
        auto area = std::make_unique<direct_area>();
        area->ranks = std::move(ranks);
        area->self = area->index_of(me_);
        if (area->self == area->size()) throw invalid_argument("shm_transport: rank " + std::to_string(me_) + " opens the slots of a group it is not in");
        for (rank_t r : area->ranks) check_member(r);
        area->stride = layout_.slot_stride();
        area->direct_bytes = layout_.direct_bytes;
        area->maps.resize(area->size());
        area->slots.resize(area->size());
        std::size_t const bytes = 2 * area->stride;
        std::string const which = "group " + std::to_string(group);
        // Made, then opened by the others through /proc/<pid>/fd (as the segments are): two
        // exchanges, the second one each rank's verdict, so that all throw alike.
        std::array<char, verdict_text> verdict{};
        auto const note = [&](std::exception const& e) {
            std::string const what = verdict_of(e);
            std::memcpy(verdict.data(), what.data(), std::min(what.size(), verdict.size() - 1));
        };
        unique_fd fd;
        try {
            fd = create_segment(bytes, "chorus-shm-" + std::to_string(group) + "-rank-" + std::to_string(me_));
            area->maps[area->self] = mapping(fd.get(), bytes, "this rank's slots of " + which);
            for (std::size_t k = 0; k < 2; ++k) std::construct_at(reinterpret_cast<direct_slot*>(area->maps[area->self].base() + k * area->stride));
        } catch (std::exception const& e) {
            note(e);
        }
        std::int64_t const mine = fd.get();
        std::vector<std::byte> const fds = allgather(std::as_bytes(std::span(&mine, 1)));
        auto const fd_of = [&](std::size_t i) {
            std::int64_t theirs = 0;
            std::memcpy(&theirs, fds.data() + i * sizeof theirs, sizeof theirs);
            return theirs;
        };
        bool all_made = true;
        for (std::size_t i = 0; i < area->size(); ++i) all_made = all_made && fd_of(i) >= 0;
        if (all_made) {  // else the rank that made none says why
            try {
                for (std::size_t i = 0; i < area->size(); ++i) {
                    std::int64_t const theirs = fd_of(i);
                    if (i == area->self) continue;
                    long const pid = peer_of(area->ranks[i]).pid;
                    unique_fd const peer(open_peer_segment(pid, static_cast<int>(theirs)));
                    if (peer.get() < 0) throw_system("opening rank " + std::to_string(area->ranks[i]) + "'s slots of " + which + " (/proc/" + std::to_string(pid) + "/fd)");
                    area->maps[i] = mapping(peer.get(), bytes, "rank " + std::to_string(area->ranks[i]) + "'s slots of " + which);
                }
            } catch (std::exception const& e) {
                note(e);
            }
        }
        std::vector<std::byte> const verdicts = allgather(std::as_bytes(std::span(verdict)));
        for (std::size_t i = 0; i < area->size(); ++i) {
            char const* v = reinterpret_cast<char const*>(verdicts.data() + i * verdict.size());
            if (v[0] != 0)
                throw detail::agreed<transport_error>(errc::connection_failed, area->ranks[i],
                                              "shm_transport: rank " + std::to_string(area->ranks[i]) + " could not join the direct exchanges of " +
                                                  which + ": " + std::string(v, strnlen(v, verdict.size())));
        }
        for (std::size_t i = 0; i < area->size(); ++i) area->slots[i] = area->maps[i].base();
        auto& slot = areas_[group];
        slot = std::move(area);
        return *slot;
        // fd closes here: every rank of the sub-group mapped the slots.
    }
    /// The largest block of a sub-group's direct exchange (open_area): the slots' size, also
    /// where the whole group has none (it spans hosts, but a sub-group may not).
    std::size_t area_bytes() const noexcept { return layout_.direct_bytes; }
    /// Ends sub-group `group`'s direct exchanges here (its slots stay mapped by peers that map them).
    void close_area(std::uint64_t group) noexcept { areas_.erase(group); }

    /// exchange(), block(), agreed() and await_round() of a sub-group's rounds (open_area):
    /// `from` and `r` are its own ranks.
    void exchange(direct_area& a, std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from) {
        publish_round(a, pieces, agreed, tag, from, false);
    }
    bool await_round(direct_area& a) {
        if (a.settled == a.round) return false;
        for (std::size_t i = 0; i < a.size(); ++i) await_block(a, i);
        a.settled = a.round;
        return true;
    }
    static std::span<std::byte const> block(direct_area const& a, rank_t r) noexcept {
        direct_slot const* s = a.slot(static_cast<std::size_t>(r), a.round);
        return {reinterpret_cast<std::byte const*>(s) + direct_block_offset, static_cast<std::size_t>(s->bytes & ~in_place_round)};
    }
    static std::uint64_t agreed(direct_area const& a, rank_t r) noexcept { return a.slot(static_cast<std::size_t>(r), a.round)->agreed; }

private:
    // `from`: an index of `a`, or -1 (every rank's).
    void publish_round(direct_area& a, std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from,
                       bool in_place) {
        throw_if_failed();
        if (a.size() == 0) throw invalid_argument("shm_transport: no direct exchange in a group that spans hosts");
        if (from >= static_cast<rank_t>(a.size()))
            throw invalid_argument("shm_transport: a direct round from rank " + std::to_string(from) + " of " + std::to_string(a.size()));
        std::size_t bytes = 0;
        for (auto const& piece : pieces) bytes += piece.size();
        if (bytes > a.direct_bytes)
            throw invalid_argument("shm_transport: a direct block of " + std::to_string(bytes) + " bytes exceeds direct_bytes " +
                                   std::to_string(a.direct_bytes));
        if (a.settled != a.round) await_round(a);
        std::uint64_t const round = ++a.round;
        direct_slot* own = a.slot(a.self, round);
        own->agreed = agreed;
        own->bytes = bytes | (in_place ? in_place_round : 0);
        own->tag = tag;
        std::byte* to = reinterpret_cast<std::byte*>(own) + direct_block_offset;
        for (auto const& piece : pieces) {
            if (!piece.empty()) std::memcpy(to, piece.data(), piece.size());
            to += piece.size();
        }
        own->round.store(round, std::memory_order_release);
        for (rank_t r : a.ranks)
            if (r != me_) ring_doorbell(*peer_of(r).header);
        a.round_tag = tag;
        a.round_in_place = in_place;
        if (from < 0) await_round(a);
        else if (static_cast<std::size_t>(from) != a.self) await_block(a, static_cast<std::size_t>(from));
    }

public:

    /// Waits until every rank published its block of this rank's latest round (after a round
    /// that waited for one rank only), as exchange() waits; then block(r) and agreed(r) show
    /// every rank's. Returns whether it waited: false where the round was every rank's already.
    bool await_round() { return await_round(whole_); }
    std::span<std::byte const> block(rank_t r) const noexcept { return block(whole_, r); }
    std::uint64_t agreed(rank_t r) const noexcept { return agreed(whole_, r); }

    /// Whether `peer` can read this rank's memory (probed at set-up): messages to it of
    /// remote_bytes and more then go remote where goes_remote() says.
    bool reads_remote(rank_t peer) const noexcept { return peers_[static_cast<std::size_t>(peer)].remote_ok; }
    bool oversubscribed() const noexcept { return oversubscribed_; }
    /// Rank r's process id (its memory files are opened through /proc/<pid>/fd).
    long pid_of(rank_t r) const noexcept { return r == me_ ? static_cast<long>(::getpid()) : peers_[static_cast<std::size_t>(r)].pid; }

    op_ptr isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        check_member(peer);
        throw_if_failed();
        peer_state& s = peer_of(peer);
        // The common small message: written whole at once, nothing to wait for, no allocation.
        std::size_t written = 0;
        bool started = false;
        bool const remote = goes_remote(s, bytes.size());
        if (s.sends.empty() && s.acks.empty() && !remote) {
            started = write_part(s, tag, bytes.size(), bytes.data(), bytes.size(), record_kind::message, written);
            if (started && written == bytes.size()) return nullptr;
        }
        auto op = make_op<shm_op>(true, peer, tag, bytes.size());
        op->out = bytes.data();
        op->remote = remote;
        op->started = started;
        op->offset = written;
        s.sends.push_back(op);
        push_sends(s);
        return op->done ? nullptr : op;
    }

    op_ptr irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        check_member(peer);
        throw_if_failed();
        auto op = make_op<shm_op>(false, peer, tag, bytes.size());
        op->in = bytes.data();
        peer_state& s = peer_of(peer);
        drain(s);  // messages already in the ring are older than any still to come
        auto& queue = s.queue;
        auto const it = queue.find_message(*op, me_);
        if (op->done) return op;  // a message of another collective failed it
        if (it == queue.messages().end()) {
            queue.post(op);
            return op;
        }
        take_unexpected(s, op, **it);
        queue.messages().erase(it);
        push_sends(s);  // the ack of a remote message of another size
        return op;
    }

    void wait(op_ptr const& op) {
        if (!op->done) {
            auto const deadline = deadline_after(timeout_);
            idle_state idle{std::chrono::steady_clock::now()};
            while (!op->done) {
                progress();
                if (op->done) break;
                if (companion_ && idle.polls % 64 == 63) companion_->poke();
                check_failed(*op);
                if (!pause(*op, idle, deadline, [&] { return op->done; })) break;
            }
        }
        if (!op->done) unpost(*op);
        conclude_wait(*op, me_, timeout_, [&](std::string const& what) { abort(me_, what); });
    }

    bool test(op_ptr const& op) {
        if (!op->done) {
            progress();
            if (companion_ && !op->done) companion_->poke();
            if (!op->done) {
                check_failed(*op);
                if (!check_peers_due(std::chrono::steady_clock::now(), *op) || !op->done) return false;
            }
        }
        wait(op);  // done: returns or throws the recorded error
        return true;
    }

    /// A request destroyed before it completed: its buffer is not touched afterwards, and the
    /// group fails (the peer's matching message would be lost).
    void cancel(op_ptr const& op) noexcept {
        if (op->done) return;
        peer_state& s = peer_of(op->peer);
        if (op->is_send) {
            std::erase(s.sends, op);
            std::erase(s.awaiting, op);
        } else {
            unpost(*op);
            if (s.into == op) {
                s.discard = op->size - op->offset;
                s.into.reset();
            }
        }
        op->fail(errc::aborted, "cancelled");
        abort(me_, abandoned_message(me_, op->is_send, op->tag, op->peer));
    }

    /// The engine this one drives while it waits (detail/companion.hpp); null: none.
    void set_companion(companion* c) noexcept { companion_ = c; }

    /// One non-blocking round, for an engine this one is the companion of: messages moved,
    /// peers' liveness checked (at most every 10 ms), a failure written by a peer adopted.
    void drive() {
        progress();
        auto const now = std::chrono::steady_clock::now();
        if (now - last_check_ >= std::chrono::milliseconds(10)) {
            last_check_ = now;
            check_processes();
        }
        if (!failure_.failed() && own_->failed_by.load(std::memory_order_acquire) >= 0) {
            adopt_failure();
            abort(failure_.blamed(), failure_.reason());
        }
    }

    /// Whether a message is on its way: a send not wholly written (or not acknowledged), a
    /// receive posted or half filled, records unread in a ring.
    bool busy() const noexcept {
        for (auto const& s : peers_) {
            if (!s.header) continue;
            if (!s.sends.empty() || !s.acks.empty() || !s.awaiting.empty() || !s.reads.empty() || s.queue.has_receives() || s.into ||
                s.into_unexpected || s.discard != 0 || s.in->head.load(std::memory_order_relaxed) != s.in_tail)
                return true;
        }
        return false;
    }

    /// The group's failure as this rank knows it (failed() false: none yet).
    group_failure const& failure() const noexcept { return failure_; }

    /// Fails the group on behalf of `blamed`, on every rank; the first reason each rank's
    /// header receives is kept.
    /// A rank that knows of a failure already spreads that one, not `reason`: a failure has
    /// consequences (the requests its exception destroys abort too), and a rank that has not
    /// heard of the failure yet must hear of its cause.
    void abort(rank_t blamed, std::string const& reason) noexcept {
        if (!failure_.failed() && own_ && own_->failed_by.load(std::memory_order_acquire) >= 0) {
            try {
                adopt_failure();
            } catch (...) {  // no memory for the reason's copy: ours goes out instead
            }
        }
        if (failure_.set(blamed, reason)) report_blame(blame_fd_, me_, blamed);
        rank_t const cause = failure_.blamed();
        std::string const& why = failure_.reason();
        for (auto& q : peers_) {
            if (!q.header) continue;
            std::int32_t expected = -1;
            if (q.header->failed_by.compare_exchange_strong(expected, cause)) {
                std::size_t const n = std::min(why.size(), reason_bytes - 1);
                std::memcpy(q.header->reason, why.data(), n);
                q.header->reason[n] = '\0';
                q.header->reason_ready.store(1, std::memory_order_release);
            }
            ring_doorbell(*q.header, /*always=*/true);
        }
        drop_receives();
    }

private:
    struct peer_state {
        mapping map;                  // the peer's segment (empty for this rank: own_map_)
        rank_header* header = nullptr;
        ring_header* out = nullptr;   // this rank's ring in the peer's segment
        std::byte* out_data = nullptr;
        ring_header* in = nullptr;    // the peer's ring in this rank's segment
        std::byte* in_data = nullptr;
        std::uint64_t out_head = 0, out_tail = 0, in_tail = 0;  // local copies
        std::deque<op_ptr> sends;     // waiting to be written, in order
        std::vector<op_ptr> awaiting; // remote sends waiting for their ack
        std::deque<std::uint64_t> acks;
        std::deque<op_ptr> reads;     // receives matched to remote messages, to read (progress)
        match_queue<shm_op, std::unique_ptr<shm_unexpected>> queue;
        op_ptr into;                            // the receive the message in parts goes to
        shm_unexpected* into_unexpected = nullptr;  // ... or the unexpected message
        std::size_t discard = 0;                // ... or bytes to skip (a failed receive's)
        long pid = 0;
        unique_fd pidfd;
        std::chrono::steady_clock::time_point stopped_since{};  // when it was first seen stopped
        bool remote_ok = false;  // the peer can read this rank's memory
        bool exited = false;
    };

    struct idle_state {
        std::chrono::steady_clock::time_point since;
        unsigned polls = 0;
    };

    struct hello {
        std::int64_t pid;
        std::int32_t fd;
        std::uint32_t pad;
        std::uint64_t ring_bytes;
        std::uint64_t probe;
        std::uint64_t direct_bytes;
        char host[112];
        cpu_set_t cpus;  // where the rank's thread may run (own_cpus)
    };
    static constexpr std::uint64_t probe_value = 0x63686f7275732121;  // "chorus!!"
    static constexpr std::size_t verdict_text = 256;

    peer_state& peer_of(rank_t r) noexcept { return peers_[static_cast<std::size_t>(r)]; }
    std::size_t ring_bytes() const noexcept { return layout_.ring_bytes; }
    // Whether a message of n bytes to s is read by the peer from this rank's memory: a large
    // one, the pair able to, and this rank taking in a message itself. One copy beats two when
    // both ranks copy anyway (an exchange, a ring's step); a rank that only sends (a
    // broadcast's root) would idle while its peer reads alone, where the ring's two copies
    // share the work between two cores (2x faster for a 16-64 MiB broadcast of 2 ranks).
    // Decided once, at isend.
    bool goes_remote(peer_state const& s, std::size_t n) const noexcept {
        return s.remote_ok && remote_bytes_ != 0 && n >= remote_bytes_ && taking_in();
    }
    bool taking_in() const noexcept {
        return std::ranges::any_of(peers_, [](peer_state const& q) { return q.queue.has_receives() || q.into || !q.reads.empty(); });
    }

    // Set-up: segments made and mapped by every rank, remote reads probed, all agreed in two
    // exchanges over the bootstrap; an error of any rank is thrown on every rank.
    template <class Allgather>
    void set_up(Allgather&& allgather) {
        auto const p = peers_.size();
        if (slot_[static_cast<std::size_t>(me_)] < 0)
            throw invalid_argument("shm_transport: rank " + std::to_string(me_) + " is not among the ranks it shares memory with");
        allow_remote_reads();
        unique_fd fd = create_segment(layout_.total(), "chorus-shm-rank-" + std::to_string(me_));
        own_map_ = mapping(fd.get(), layout_.total(), "this rank's segment");
        std::byte* const base = own_map_.base();
        own_ = std::construct_at(reinterpret_cast<rank_header*>(base));  // not placement new: nvcc looks for an aligned placement form that does not exist
        for (std::size_t s = 0; s < layout_.size; ++s) std::construct_at(layout_.ring(base, s));

        hello mine{};
        mine.pid = static_cast<std::int64_t>(::getpid());
        mine.fd = fd.get();
        mine.ring_bytes = layout_.ring_bytes;
        mine.direct_bytes = layout_.direct_bytes;
        mine.probe = reinterpret_cast<std::uintptr_t>(&probe_);
        mine.cpus = own_cpus();
        std::string const host = host_identity();
        std::memcpy(mine.host, host.data(), std::min(host.size(), sizeof mine.host - 1));
        std::vector<std::byte> const hellos = allgather(std::as_bytes(std::span(&mine, 1)));
        auto const hello_of = [&](std::size_t r) {
            hello h;
            std::memcpy(&h, hellos.data() + r * sizeof(hello), sizeof h);
            return h;
        };
        // Oversubscribed: the ranks of this host outnumber the CPUs they may run on together.
        // Counted over all their masks, not this rank's alone: ranks bound one to a core each
        // (taskset, srun --cpu-bind, mpirun's default binding) have a core per rank, though each
        // may run on one CPU only; unbound ranks, or ranks bound to the same cores, share.
        // And over every rank of the group on this host, members or not: node_transport's nodes
        // named apart on one host (CHORUS_NODE, network namespaces) share its CPUs. (Counting
        // members only, 2 nodes x 2 ranks on 2 CPUs spun without yielding while the other
        // node's ranks needed the cores: 8-byte allreduce 134 us, 68-109 us yielding.)
        cpu_set_t together;
        CPU_ZERO(&together);
        std::size_t here = 0;
        for (std::size_t r = 0; r < p; ++r) {
            hello const h = hello_of(r);
            if (std::strncmp(h.host, mine.host, sizeof mine.host) != 0) continue;
            ++here;
            cpu_set_t theirs = h.cpus;
            CPU_OR(&together, &together, &theirs);
        }
        oversubscribed_ = here > static_cast<std::size_t>(CPU_COUNT(&together));
        // Whether every rank could join, agreed before anyone goes on: a rank that cannot (its
        // peers on another host, a segment it cannot open) says why, and every rank throws
        // that, of the kind it was (a configuration error or a failed connection) — also the
        // ranks of other nodes, whose own members were fine.
        std::vector<std::byte> verdict(verdict_text + p + 1);  // an error text, whom we can read, the error's kind
        std::byte& misconfigured = verdict[verdict_text + p];
        auto const note = [&](std::exception const& e) {
            std::string const what = verdict_of(e);
            std::memcpy(verdict.data(), what.data(), std::min(what.size(), verdict_text - 1));
        };
        try {
            check_members(hello_of, mine);  // before any segment is opened: a pid on another host is some other process
            for (std::size_t r = 0; r < p; ++r)
                if (slot_[r] >= 0) connect_peer(static_cast<rank_t>(r), hello_of(r), verdict[verdict_text + r]);
        } catch (invalid_argument const& e) {
            note(e);
            misconfigured = std::byte{1};
        } catch (std::exception const& e) {
            note(e);
        }
        std::vector<std::byte> const verdicts = allgather(std::span<std::byte const>(verdict));
        for (std::size_t r = 0; r < p; ++r) {
            auto const* v = verdicts.data() + r * verdict.size();
            if (v[0] != std::byte{0}) {
                std::string const why(reinterpret_cast<char const*>(v), strnlen(reinterpret_cast<char const*>(v), verdict_text));
                if (v[verdict_text + p] != std::byte{0}) throw detail::agreed<invalid_argument>(why);
                throw detail::agreed<transport_error>(errc::connection_failed, static_cast<rank_t>(r),
                                              "shm_transport: rank " + std::to_string(r) + " could not join: " + why);
            }
            peers_[r].remote_ok = v[verdict_text + static_cast<std::size_t>(me_)] != std::byte{0};
        }
        if (layout_.size == p) {  // every rank a member: the whole group exchanges directly
            whole_.self = static_cast<std::size_t>(me_);
            whole_.stride = layout_.slot_stride();
            whole_.direct_bytes = layout_.direct_bytes;
            for (std::size_t r = 0; r < p; ++r) {
                whole_.ranks.push_back(static_cast<rank_t>(r));
                std::byte* const segment = peers_[r].map.base() ? peers_[r].map.base() : own_map_.base();
                whole_.slots.push_back(reinterpret_cast<std::byte*>(layout_.slot(segment, 0)));
            }
        }
        // fd closes here: every rank mapped the segment, no name is left anywhere.
    }

    // A set-up error's text for the verdict every rank throws: without the error code's suffix
    // (system_error's what() appends ": invalid argument"), which the exception thrown from it
    // appends again.
    static std::string verdict_of(std::exception const& e) {
        std::string what = e.what();
        if (auto const* s = dynamic_cast<std::system_error const*>(&e))
            if (std::string const suffix = ": " + s->code().message(); what.ends_with(suffix)) what.resize(what.size() - suffix.size());
        return what;
    }

    // Every member on this host, with the same ring and direct sizes.
    template <class HelloOf>
    void check_members(HelloOf const& hello_of, hello const& mine) const {
        auto const p = peers_.size();
        for (std::size_t r = 0; r < p; ++r) {
            if (slot_[r] < 0) continue;
            hello const h = hello_of(r);
            if (std::strncmp(h.host, mine.host, sizeof mine.host) != 0)
                throw invalid_argument("shm_transport: ranks " + std::to_string(me_) + " and " + std::to_string(r) +
                                       " are not on one host (or not in one PID namespace); shared memory joins the "
                                       "ranks of one host only: " +
                                       (layout_.size == p ? "use tcp_transport" : "set CHORUS_NODE to tell their hosts apart"));
            agree(r, "ring_bytes", h.ring_bytes, mine.ring_bytes, "CHORUS_SHM_RING_BYTES");
            agree(r, "direct_bytes", h.direct_bytes, mine.direct_bytes, "CHORUS_SHM_DIRECT_BYTES");
        }
    }
    // A setting every rank of the host must share (it shapes the segments they map).
    void agree(std::size_t r, char const* what, std::uint64_t theirs, std::uint64_t mine, char const* variable) const {
        if (theirs != mine)
            throw invalid_argument("shm_transport: rank " + std::to_string(r) + " has " + what + " " + std::to_string(theirs) +
                                   ", rank " + std::to_string(me_) + " " + std::to_string(mine) + " (" + variable +
                                   " must agree)");
    }

    void connect_peer(rank_t r, hello const& h, std::byte& can_read) {
        peer_state& s = peer_of(r);
        auto const u = static_cast<std::size_t>(r);
        std::byte* base = own_map_.base();
        if (r != me_) {
            unique_fd fd(open_peer_segment(h.pid, h.fd));
            if (fd.get() < 0) throw_system("opening rank " + std::to_string(r) + "'s segment (/proc/" + std::to_string(h.pid) + "/fd)");
            s.map = mapping(fd.get(), layout_.total(), "rank " + std::to_string(r) + "'s segment");
            base = s.map.base();
            s.pidfd = unique_fd(open_pidfd(h.pid));
        }
        s.pid = h.pid;
        s.header = layout_.header(base);
        auto const mine = static_cast<std::size_t>(slot_[static_cast<std::size_t>(me_)]);
        auto const theirs = static_cast<std::size_t>(slot_[u]);
        s.out = layout_.ring(base, mine);
        s.out_data = layout_.data(base, mine);
        s.in = layout_.ring(own_map_.base(), theirs);
        s.in_data = layout_.data(own_map_.base(), theirs);
        std::uint64_t seen = 0;
        if (remote_bytes_ != 0 && read_remote(h.pid, &seen, h.probe, sizeof seen) == 0 && seen == probe_value)
            can_read = std::byte{1};
    }

    // ---- writing records -------------------------------------------------------------------

    // Room for one record of `payload` bytes (fewer when `split`, at least 0) at the head of
    // s's ring, wrapping if needed; false when the ring is too full.
    bool reserve(peer_state& s, std::size_t& payload, bool split) {
        std::size_t const cap = ring_bytes();
        for (;;) {
            std::size_t const pos = static_cast<std::size_t>(s.out_head % cap);
            std::size_t const contiguous = cap - pos;
            std::size_t free = cap - static_cast<std::size_t>(s.out_head - s.out_tail);
            if (free < record_bytes(payload)) {
                s.out_tail = s.out->tail.load(std::memory_order_acquire);
                free = cap - static_cast<std::size_t>(s.out_head - s.out_tail);
            }
            std::size_t const fit = std::min(contiguous, free);
            if (record_bytes(payload) <= fit) return true;
            if (split && fit >= line) {
                payload = fit - record_header_bytes;
                return true;
            }
            if (contiguous >= free || free < line) return false;
            record_header const wrap{0, 0, 0, 0, record_kind::wrap, 0};
            std::memcpy(s.out_data + pos, &wrap, sizeof wrap);
            s.out_head += contiguous;
        }
    }

    void publish(peer_state& s) noexcept {
        s.out->head.store(s.out_head, std::memory_order_release);
        ring_doorbell(*s.header);
    }

    // Writes record `h` and its h.bytes of payload at the head (reserved) and publishes it.
    void put(peer_state& s, record_header const& h, std::byte const* payload) {
        std::byte* at = s.out_data + s.out_head % ring_bytes();
        std::memcpy(at, &h, sizeof h);
        if (h.bytes != 0 && payload) std::memcpy(at + record_header_bytes, payload, h.bytes);
        s.out_head += record_bytes(h.bytes);
        publish(s);
    }

    bool write_record(peer_state& s, record_header const& h, std::byte const* payload) {
        std::size_t n = h.bytes;
        if (!reserve(s, n, false)) return false;
        put(s, h, payload);
        return true;
    }

    // Writes a record of up to `want` bytes of a message's payload (its first part when kind
    // is `message`); false when the ring has no room. `written`: the payload bytes it took.
    bool write_part(peer_state& s, tag_t tag, std::size_t size, std::byte const* payload, std::size_t want,
                    record_kind kind, std::size_t& written) {
        std::size_t n = std::min(want, part_bytes_);
        if (!reserve(s, n, true)) return false;
        put(s, {tag, size, 0, 0, kind, static_cast<std::uint32_t>(n)}, payload);
        written = n;
        return true;
    }

    // Writes what fits of s's queued acks and sends, in order.
    void push_sends(peer_state& s) {
        while (!s.acks.empty()) {
            if (!write_record(s, {0, 0, 0, s.acks.front(), record_kind::ack, 0}, nullptr)) return;
            s.acks.pop_front();
        }
        while (!s.sends.empty()) {
            shm_op& op = *s.sends.front();
            if (op.remote) {
                op.id = ++last_id_;
                if (!write_record(s, {op.tag, op.size, reinterpret_cast<std::uintptr_t>(op.out), op.id, record_kind::remote, 0}, nullptr))
                    return;
                s.awaiting.push_back(std::move(s.sends.front()));
                s.sends.pop_front();
                continue;
            }
            while (!op.started || op.offset != op.size) {
                std::size_t written = 0;
                if (!write_part(s, op.tag, op.size, op.out + op.offset, op.size - op.offset,
                                op.started ? record_kind::more : record_kind::message, written))
                    return;
                op.started = true;
                op.offset += written;
            }
            op.done = true;
            s.sends.pop_front();
        }
    }

    // ---- reading records -------------------------------------------------------------------

    // Moves every ring, then makes the remote reads matched meanwhile: a read is long (a
    // message of megabytes), and the peer reads this rank's messages at the same time only if
    // their records went out first — a read made where it matched (in irecv, before the
    // caller's isend) made the two ranks of an exchange read one after the other.
    void progress() {
        bool reads = false;
        for (auto& s : peers_) {
            if (!s.header) continue;  // not a member
            drain(s);
            if (!s.sends.empty() || !s.acks.empty()) push_sends(s);
            reads = reads || !s.reads.empty();
        }
        if (reads) read_matched();
        buffer_remotes();
    }

    // A failed group reads nothing more: the sender may have given its buffer back.
    void read_matched() {
        if (group_failed()) return drop_receives();
        for (auto& s : peers_) {
            while (!s.reads.empty()) {
                op_ptr const op = std::move(s.reads.front());
                s.reads.pop_front();
                read_from(s, *op, op->addr);
                s.acks.push_back(op->id);
                push_sends(s);
            }
        }
    }

    // Handles every record the peer published in its ring to this rank.
    void drain(peer_state& s) {
        std::uint64_t const head = s.in->head.load(std::memory_order_acquire);
        if (head == s.in_tail) return;
        std::size_t const cap = ring_bytes();
        while (s.in_tail != head) {
            std::size_t const pos = static_cast<std::size_t>(s.in_tail % cap);
            std::byte const* at = s.in_data + pos;
            record_header h;
            std::memcpy(&h, at, sizeof h);
            std::byte const* payload = at + record_header_bytes;
            std::size_t length = record_bytes(h.bytes);
            switch (h.kind) {
            case record_kind::wrap: length = cap - pos; break;
            case record_kind::message: on_message(s, h, payload); break;
            case record_kind::more: on_more(s, h.bytes, payload); break;
            case record_kind::remote: on_remote(s, h); break;
            case record_kind::ack: on_ack(s, h.id); break;
            default:
                abort(me_, "rank " + std::to_string(me_) + ": the shared-memory ring from rank " +
                               std::to_string(sender_of(s)) + " is corrupt (a record of kind " +
                               std::to_string(static_cast<unsigned>(h.kind)) + ")");
                throw_if_failed();
            }
            s.in_tail += length;
            s.in->tail.store(s.in_tail, std::memory_order_release);
        }
        ring_doorbell(*s.header);  // its sender may wait for room
    }

    rank_t sender_of(peer_state const& s) const noexcept { return static_cast<rank_t>(&s - peers_.data()); }

    void on_message(peer_state& s, record_header const& h, std::byte const* payload) {
        rank_t const from = sender_of(s);
        if (op_ptr op = s.queue.take_receive(me_, from, h.tag)) {
            if (!check_size(*op, me_, h.size)) {
                s.discard = h.size - h.bytes;
                return;
            }
            if (h.bytes != 0) std::memcpy(op->in, payload, h.bytes);
            op->offset = h.bytes;
            if (op->offset == op->size) op->done = true;
            else s.into = std::move(op);
            return;
        }
        auto u = std::make_unique<shm_unexpected>();
        u->tag = h.tag;
        u->size = h.size;
        u->bytes = host_memory::buffer<std::byte>(h.size);
        if (h.bytes != 0) std::memcpy(u->bytes.span().data(), payload, h.bytes);
        u->filled = h.bytes;
        if (!u->complete()) s.into_unexpected = u.get();
        s.queue.messages().push_back(std::move(u));
    }

    void on_more(peer_state& s, std::size_t n, std::byte const* payload) {
        if (s.discard != 0) {
            s.discard -= std::min(n, s.discard);
        } else if (s.into) {
            std::memcpy(s.into->in + s.into->offset, payload, n);
            s.into->offset += n;
            if (s.into->offset == s.into->size) {
                s.into->done = true;
                s.into.reset();
            }
        } else if (s.into_unexpected) {
            shm_unexpected& u = *s.into_unexpected;
            std::memcpy(u.bytes.span().data() + u.filled, payload, n);
            u.filled += n;
            if (u.complete()) s.into_unexpected = nullptr;
        }
    }

    void on_remote(peer_state& s, record_header const& h) {
        rank_t const from = sender_of(s);
        if (op_ptr op = s.queue.take_receive(me_, from, h.tag)) return to_read(s, op, h.size, h.addr, h.id);
        auto u = std::make_unique<shm_unexpected>();
        u->tag = h.tag;
        u->size = h.size;
        u->remote = true;
        u->addr = h.addr;
        u->id = h.id;
        u->arrived = std::chrono::steady_clock::now();
        s.queue.messages().push_back(std::move(u));
        unmatched_remotes_ = true;
    }

    // Reads every remote message that no receive matched within buffer_after() of its record
    // into a buffer of its own, and releases its sender. A remote send completes only once
    // read, so without this it would wait for a receive its peer posts only after its own
    // send completed: two ranks that each send before they receive (blocking calls, or
    // test() loops) would wait for each other until the timeout, where the rings buffer. Every
    // progress does it, so waits, test() and a companion's drive() alike; not at once, which
    // would cost a copy that the receive about to be posted makes anyway.
    void buffer_remotes() {
        if (!unmatched_remotes_ || group_failed()) return;
        auto const now = std::chrono::steady_clock::now();
        bool waiting = false;  // messages too young yet
        for (auto& s : peers_) {
            if (!s.header) continue;
            for (auto& u : s.queue.messages()) {
                if (!u->remote) continue;
                if (now - u->arrived < buffer_after()) {
                    waiting = true;
                    continue;
                }
                if (group_failed()) return;  // nothing read after a failure: its sender may have reused the buffer
                u->bytes = host_memory::buffer<std::byte>(u->size);
                if (int const e = read_remote(s.pid, u->bytes.span().data(), u->addr, u->size); e != 0)
                    return abort(sender_of(s), read_failed_message(sender_of(s), u->size, u->tag, e));
                u->remote = false;
                u->filled = u->size;
                s.acks.push_back(u->id);
            }
            if (!s.acks.empty()) push_sends(s);
        }
        unmatched_remotes_ = waiting;
    }

    // How long a remote message waits for its receive before buffer_remotes reads it: the
    // spin, and at least 50 us (a peer a little ahead posts its receive within that).
    std::chrono::microseconds buffer_after() const noexcept { return std::max(spin_, std::chrono::microseconds(50)); }

    void on_ack(peer_state& s, std::uint64_t id) {
        auto const it = std::ranges::find_if(s.awaiting, [&](op_ptr const& op) { return op->id == id; });
        if (it == s.awaiting.end()) return;  // a send that was cancelled
        (*it)->done = true;
        s.awaiting.erase(it);
    }

    // A receive matched to a remote message: read at the next progress (read_matched), or
    // failed at once (another size) and the sender released.
    void to_read(peer_state& s, op_ptr const& op, std::size_t size, std::uint64_t addr, std::uint64_t id) {
        if (!check_size(*op, me_, size)) {
            s.acks.push_back(id);
            return;
        }
        op->addr = addr;
        op->id = id;
        s.reads.push_back(op);
    }

    void read_from(peer_state& s, shm_op& op, std::uint64_t addr) {
        if (int const e = read_remote(s.pid, op.in, addr, op.size); e != 0) {
            std::string const what = read_failed_message(op.peer, op.size, op.tag, e);
            abort(op.peer, what);
            op.fail(errc::peer_failed, what);
            return;
        }
        op.done = true;
    }

    // The sender is to blame: it exited (ESRCH), or its buffer is gone (EFAULT).
    std::string read_failed_message(rank_t from, std::size_t size, tag_t tag, int e) const {
        return "rank " + std::to_string(me_) + ": reading " + std::to_string(size) + " bytes from rank " + std::to_string(from) +
               "'s memory (" + describe_tag(tag) + ") failed: " + std::system_category().message(e) +
               (e == ESRCH ? " (its process exited)" : "");
    }

    // A receive meets the unexpected message `u` (which the caller then erases).
    void take_unexpected(peer_state& s, op_ptr const& receive, shm_unexpected& u) {
        shm_op& op = *receive;
        if (u.remote) return to_read(s, receive, u.size, u.addr, u.id);
        bool const arriving = s.into_unexpected == &u;
        if (arriving) s.into_unexpected = nullptr;
        if (!check_size(op, me_, u.size)) {
            if (arriving) s.discard = u.size - u.filled;
            return;
        }
        if (u.filled != 0) std::memcpy(op.in, u.bytes.span().data(), u.filled);
        op.offset = u.filled;
        if (u.complete()) op.done = true;
        else s.into = receive;  // the rest goes straight to its buffer
    }

    // ---- waiting -----------------------------------------------------------------------------

    // A wait of a's round for the block of its rank i, which must belong to the same collective.
    void await_block(direct_area& a, std::size_t i) {
        direct_slot const* theirs = a.slot(i, a.round);
        rank_t const r = a.ranks[i];
        if (theirs->round.load(std::memory_order_acquire) != a.round) wait_published(*theirs, a.round, r, a.round_tag);
        // The same round of another collective: a rank skipped one, or called others.
        if (theirs->tag != a.round_tag) {
            std::string const what = collective_mismatch_message(me_, a.round_tag, r, theirs->tag);
            abort(me_, what);
            throw transport_error(errc::tag_mismatch, r, what);
        }
        if (((theirs->bytes & in_place_round) != 0) != a.round_in_place) {
            std::string const what = "rank " + std::to_string(me_) + (a.round_in_place ? " reads buffers where they lie in " : " reads copies in ") +
                                     describe_tag(a.round_tag) + " but rank " + std::to_string(r) +
                                     (a.round_in_place ? " published a copy" : " exposed its buffer") +
                                     ": the ranks run different algorithms of it (CHORUS_ALGO must agree)";
            abort(me_, what);
            throw transport_error(errc::tag_mismatch, r, what);
        }
    }

    // exchange(): waits until `slot` holds `round`, as a receive from `peer` would wait.
    void wait_published(direct_slot const& slot, std::uint64_t round, rank_t peer, tag_t tag) {
        shm_op op;  // what the wait is said to be for, in errors
        op.peer = peer;
        op.tag = tag;
        op.direct = true;
        op.awaited = &slot;
        op.round = round;
        auto const deadline = deadline_after(timeout_);
        idle_state idle{std::chrono::steady_clock::now()};
        auto const arrived = [&] { return slot.round.load(std::memory_order_acquire) == round; };
        while (!arrived()) {
            progress();
            if (arrived()) break;
            if (companion_ && idle.polls % 64 == 63) companion_->poke();
            check_failed(op);
            if (op.done || !pause(op, idle, deadline, arrived)) break;
        }
        if (arrived() && !op.done) return;
        conclude_wait(op, me_, timeout_, [&](std::string const& what) { abort(me_, what); });
    }

    // The group failed: no receive is matched or read any more (their waits throw the failure).
    void drop_receives() noexcept {
        for (auto& q : peers_) {
            q.queue.drop_receives();
            q.reads.clear();
        }
    }

    // A receive given up (a failure, a timeout, a cancel): its buffer is not touched again.
    void unpost(shm_op& op) noexcept {
        if (op.is_send) return;
        peer_state& s = peer_of(op.peer);
        s.queue.unpost(op);
        std::erase_if(s.reads, [&](op_ptr const& r) { return r.get() == &op; });
    }

    void throw_if_failed() {
        if (!failure_.failed() && own_->failed_by.load(std::memory_order_acquire) >= 0) {
            adopt_failure();
            abort(failure_.blamed(), failure_.reason());  // on to ranks its writer has not reached yet
        }
        failure_.throw_if_failed(me_);
    }

    // Whether the group failed: known here, or written into this rank's header by another rank.
    bool group_failed() const noexcept { return failure_.failed() || own_->failed_by.load(std::memory_order_acquire) >= 0; }

    void check_failed(shm_op& op) {
        if (group_failed()) {
            unpost(op);
            throw_if_failed();
        }
    }

    // Another rank wrote the group's failure into this rank's header: take its reason.
    void adopt_failure() {
        rank_t const blamed = own_->failed_by.load(std::memory_order_acquire);
        auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
        while (own_->reason_ready.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until)
            ::sched_yield();
        std::string reason = own_->reason_ready.load(std::memory_order_acquire) != 0
                                 ? std::string(own_->reason, strnlen(own_->reason, reason_bytes))
                                 : std::string("(the rank that failed the group wrote no reason)");
        if (failure_.set(blamed, reason)) report_blame(blame_fd_, me_, blamed);
        drop_receives();
    }

    // One idle round of a wait on `op` (done(): what it waits for happened): polls, yields or
    // sleeps; false once the deadline passed.
    template <class Done>
    bool pause(shm_op& op, idle_state& idle, std::chrono::steady_clock::time_point deadline, Done const& done) {
        // With a core per rank, polls without a system call for the whole spin: a message on
        // its way arrives within a cache miss or two, and a sched_yield (about a microsecond on
        // a VM) is time in which the waiter cannot see it. With more ranks than cores the peer
        // we wait for may need this very core: yield at once, and at every round after. (Every
        // wait polled 256 times, up to 140 cycles each, before its first yield: an 8-byte
        // allreduce of 4 ranks on 2 cores took 49 us; then 16 polls: 2.9-5.0 us for a 16-byte
        // allgather, alltoall, allreduce or barrier of 4 ranks, 1.9-2.5 us yielding at once,
        // three interleaved rounds; 1 KiB to 16 MiB level.)
        ++idle.polls;
        if (!oversubscribed_ && (idle.polls < 256u || idle.polls % 64 != 0)) {
            cpu_relax();
            return true;
        }
        auto const now = std::chrono::steady_clock::now();
        if (now >= deadline) return false;
        bool const spinning = now - idle.since < spin_;
        // The companion (node_transport's sockets): every round while it has work in flight,
        // else once per sleep (a failure it would report); wait() pokes every 64 rounds too.
        // An idle companion's poke is a ppoll that finds nothing, a second system call per round
        // beside the yield.
        if (companion_ && (!spinning || companion_->busy())) companion_->poke();
        if (spinning) {
            if (oversubscribed_) ::sched_yield();  // a rank of this host that has work goes first
            return true;
        }
        if (check_peers_due(now, op) && (op.done || done())) return true;
        // Sleep until a peer rings (it sees `sleeping`), a slice passes, or the deadline.
        own_->sleeping.store(1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        std::uint32_t const seen = own_->doorbell.load(std::memory_order_relaxed);
        progress();
        // A remote message waiting for its receive is buffered when due, not a slice later.
        std::chrono::nanoseconds const slice = unmatched_remotes_ ? std::chrono::nanoseconds(buffer_after()) : std::chrono::milliseconds(10);
        if (!op.done && !done() && own_->failed_by.load(std::memory_order_relaxed) < 0)
            futex_wait(own_->doorbell, seen, companion_sleep(companion_, std::min<std::chrono::nanoseconds>(deadline - now, slice)));
        own_->sleeping.store(0, std::memory_order_relaxed);
        return true;
    }

    static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
    }

    // check_peers(op) at most every 10 ms (it reads /proc); whether it ran.
    bool check_peers_due(std::chrono::steady_clock::time_point now, shm_op& op) {
        if (now - last_check_ < std::chrono::milliseconds(10)) return false;
        last_check_ = now;
        check_peers(op);
        return true;
    }

    // Whether a peer's process exited without leaving (it is blamed on every rank), and
    // whether the peer `op` waits for left the group (op fails, naming it).
    void check_peers(shm_op& op) {
        check_processes();
        peer_state& s = peer_of(op.peer);
        // A rank that aborted and then left: its abort (written first) is what the group says.
        // A rank publishes its last round before it leaves: a block that is there (read after
        // `left`, which the leaver set after publishing) is no loss.
        if (op.peer != me_ && s.header->left.load(std::memory_order_acquire) != 0 &&
            !(op.direct && op.awaited->round.load(std::memory_order_acquire) == op.round) &&
            own_->failed_by.load(std::memory_order_acquire) < 0) {
            drain(s);
            push_sends(s);
            unpost(op);
            if (!op.done) {  // the group fails, blaming the rank that left
                std::string const what =
                    left_message(me_, op.peer, (op.is_send ? "sent it " : "waited for its ") + describe_tag(op.tag));
                abort(op.peer, what);
                op.fail(errc::peer_failed, what);
            }
        }
        if (op.peer != me_ && !op.done) check_direct_mismatch(s, op);
    }

    // Ranks that called one collective with sizes on either side of the one_shot limit: one
    // waits for the other's block, the other sends messages (or waits for them). Both fail,
    // saying so, instead of running into the timeout.
    void check_direct_mismatch(peer_state& s, shm_op& op) {
        std::string what;
        errc code = errc::size_mismatch;
        if (op.direct) {
            auto const it = s.queue.find_message(op, me_);
            if (op.done) return;  // a message of another collective: find_message failed op
            if (it != s.queue.messages().end()) what = direct_mismatch_message(me_, op.tag, op.peer, true);
        } else {
            // The peer's slots of the (sub-)group whose collective op belongs to.
            direct_area const* area = area_of(op.tag);
            if (area == nullptr) return;
            std::size_t const i = area->index_of(op.peer);
            if (i >= area->size()) return;
            direct_slot const* a = area->slot(i, 0);
            direct_slot const* b = area->slot(i, 1);
            direct_slot const* newest = a->round.load(std::memory_order_acquire) > b->round.load(std::memory_order_acquire) ? a : b;
            if (newest->round.load(std::memory_order_acquire) == 0) return;
            if (tags_conflict(op.tag, newest->tag)) {  // the peer's latest round is of another collective
                what = collective_mismatch_message(me_, op.tag, op.peer, newest->tag);
                code = errc::tag_mismatch;
            } else if (newest->tag == op.tag) {
                what = direct_mismatch_message(me_, op.tag, op.peer, false);
            }
        }
        if (what.empty()) return;
        abort(me_, what);
        op.fail(code, what);
    }

    // Whether a peer's process exited without leaving the group (it is blamed on every rank)
    // or is stopped for too long.
    void check_processes() {
        for (auto& s : peers_) {
            rank_t const r = sender_of(s);
            if (r == me_ || s.exited || !s.header) continue;
            if (!process_exited(s.pidfd.get(), s.pid)) {
                check_stopped(s, r);
                continue;
            }
            s.exited = true;
            if (s.header->left.load(std::memory_order_acquire) != 0) continue;
            abort(r, "rank " + std::to_string(r) + "'s process (pid " + std::to_string(s.pid) +
                         ") exited without leaving the group; rank " + std::to_string(me_) + " noticed");
        }
    }

    // The direct exchanges of the group a tag belongs to (detail::tag_group): the whole
    // group's, or a sub-group's opened here; null where none.
    direct_area const* area_of(tag_t tag) const noexcept {
        std::uint64_t const group = tag_group(tag);
        if (group == 0) return &whole_;
        auto const it = areas_.find(group);
        return it == areas_.end() ? nullptr : it->second.get();
    }

    void check_member(rank_t peer) const {
        check_peer(me_, peer, size());
        if (!peers_[static_cast<std::size_t>(peer)].header)
            throw invalid_argument("shm_transport: rank " + std::to_string(me_) + " shares no memory with rank " +
                                   std::to_string(peer) + " (another host)");
    }

    static std::vector<std::int32_t> slots_of(rank_t size, std::vector<rank_t> const& members) {
        std::vector<std::int32_t> slot(static_cast<std::size_t>(size), -1);
        if (members.empty()) {
            for (std::size_t r = 0; r < slot.size(); ++r) slot[r] = static_cast<std::int32_t>(r);
            return slot;
        }
        std::int32_t next = 0;
        for (rank_t m : members) {
            if (m < 0 || m >= size)
                throw invalid_argument("shm_transport: member rank " + std::to_string(m) + " is not a rank of a group of " + std::to_string(size));
            if (slot[static_cast<std::size_t>(m)] >= 0) throw invalid_argument("shm_transport: rank " + std::to_string(m) + " is a member twice");
            slot[static_cast<std::size_t>(m)] = next++;
        }
        return slot;
    }

    // A peer stopped for stopped_limit is blamed: it holds up the group as surely as a dead one.
    void check_stopped(peer_state& s, rank_t r) {
        if (stopped_limit_.count() <= 0) return;
        if (!process_stopped(s.pid)) {
            s.stopped_since = {};
            return;
        }
        auto const now = std::chrono::steady_clock::now();
        if (s.stopped_since == std::chrono::steady_clock::time_point{}) s.stopped_since = now;
        if (now - s.stopped_since < stopped_limit_) return;
        abort(r, "rank " + std::to_string(r) + " sent nothing for " + std::to_string(stopped_limit_.count()) +
                     " ms: its process (pid " + std::to_string(s.pid) + ") is stopped (SIGSTOP, or a debugger holds it); rank " +
                     std::to_string(me_) + " noticed");
    }

    rank_t me_;
    std::chrono::milliseconds timeout_;
    std::chrono::microseconds spin_;
    std::vector<std::int32_t> slot_;  // by rank: its ring in every member's segment, or -1 (not a member)
    layout layout_;
    companion* companion_ = nullptr;
    std::size_t remote_bytes_;
    bool unmatched_remotes_ = false;  // remote messages no receive matched may wait (buffer_remotes)
    std::size_t part_bytes_;
    std::chrono::milliseconds stopped_limit_;
    int blame_fd_;
    std::vector<peer_state> peers_;
    mapping own_map_;
    rank_header* own_ = nullptr;
    group_failure failure_;
    std::uint64_t last_id_ = 0;
    direct_area whole_;  // the whole group's direct exchanges (none, direct_bytes 0, where it spans hosts)
    std::map<std::uint64_t, std::unique_ptr<direct_area>> areas_;  // sub-groups', by group number (open_area)
    bool oversubscribed_ = true;  // this host's ranks outnumber the CPUs they may run on together: yield when idle
    std::chrono::steady_clock::time_point last_check_{};  // the last check_peers, of wait() or test()
    std::uint64_t const probe_ = probe_value;  // read by peers at set-up to probe remote reads
};

} // namespace detail::shm

namespace detail {
using shm::shm_engine;
using shm::shm_op;
} // namespace detail
} // namespace chorus
