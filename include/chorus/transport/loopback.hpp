// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// loopback_transport: N ranks as threads of one process. It models the whole transport
// concept (tags, non-blocking requests, timeouts, size and collective mismatch detection,
// group abort), so code written against chorus can be unit-tested without processes or
// sockets; run_ranks(n, fn) is the harness.
//
// Sends are eager: isend copies the message into the receiver's posted buffer if a matching
// receive is waiting, otherwise into an unexpected-message queue, and completes at once.
// That gives the concept's progress rule (no deadlock, whatever the posting order) for free.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <chorus/detail/matching.hpp>
#include <chorus/detail/request_handle.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

struct loopback_options {
    /// How long any wait may block before it fails with timeout_error (Gloo's default); 0: no
    /// bound.
    std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

namespace detail {

/// A loopback receive (sends complete at once: they need no state).
struct loopback_recv : message_op {
    rank_t me = 0;  // the receiving rank
    std::byte* buffer = nullptr;
};

struct loopback_message {
    tag_t tag;
    std::vector<std::byte> bytes;
};

class loopback_world {
public:
    loopback_world(rank_t size, loopback_options options)
        : options_(options), boxes_(static_cast<std::size_t>(size)), sequences_(static_cast<std::size_t>(size)) {
        for (mailbox& box : boxes_) box.from.resize(static_cast<std::size_t>(size));
    }

    rank_t size() const noexcept { return static_cast<rank_t>(boxes_.size()); }
    loopback_options const& options() const noexcept { return options_; }

    void send(rank_t from, rank_t to, tag_t tag, std::span<std::byte const> bytes) {
        mailbox& box = box_of(to);
        std::lock_guard lock(box.mutex);
        throw_if_failed(from);
        auto& queue = box.from[static_cast<std::size_t>(from)];
        // Any receive it meets changes (completes, or fails on a mismatch): wake the waiters.
        box.ready.notify_all();
        if (auto r = queue.take_receive(to, from, tag)) return deliver(*r, bytes);
        queue.messages().push_back({tag, std::vector<std::byte>(bytes.begin(), bytes.end())});
    }

    void post(rank_t me, std::shared_ptr<loopback_recv> const& r) {
        mailbox& box = box_of(me);
        std::lock_guard lock(box.mutex);
        throw_if_failed(me);
        auto& queue = box.from[static_cast<std::size_t>(r->peer)];
        auto const it = queue.find_message(*r, me);
        if (r->done) return;  // a message of another collective failed it
        if (it == queue.messages().end()) return queue.post(r);
        deliver(*r, it->bytes);
        queue.messages().erase(it);
    }

    // Blocks until r completes, the group fails, or the timeout passes; throws on failure.
    void wait(std::shared_ptr<loopback_recv> const& r) {
        rank_t const me = r->me;
        mailbox& box = box_of(me);
        std::unique_lock lock(box.mutex);
        auto const deadline = deadline_after(options_.timeout);
        bool const finished = box.ready.wait_until(lock, deadline, [&] { return r->done || failed_.load(); });
        std::string hint;
        if (!r->done) {
            unpost(box, *r);
            if (finished) throw_if_failed(me);  // the group failed while we waited
            hint = laggards(r->tag);
        }
        lock.unlock();
        conclude_wait(*r, me, options_.timeout, [&](std::string const& what) { abort(me, what); }, hint);
    }

    bool test(std::shared_ptr<loopback_recv> const& r) {
        rank_t const me = r->me;
        mailbox& box = box_of(me);
        std::unique_lock lock(box.mutex);
        if (!r->done) {
            throw_if_failed(me);
            return false;
        }
        lock.unlock();
        wait(r);  // done: returns or throws the recorded error
        return true;
    }

    // A request destroyed before it completed: its buffer must not be written any more.
    void cancel(std::shared_ptr<loopback_recv> const& r) noexcept {
        rank_t const me = r->me;
        mailbox& box = box_of(me);
        bool was_pending = false;
        {
            std::lock_guard lock(box.mutex);
            was_pending = !r->done;
            unpost(box, *r);
        }
        if (was_pending) abort(me, abandoned_message(me, /*is_send=*/false, r->tag, r->peer));
    }

    /// Marks the group failed on behalf of `who`; the first reason is kept.
    void abort(rank_t who, std::string const& reason) noexcept {
        {
            std::lock_guard lock(failure_mutex_);
            if (!failure_.set(who, reason)) return;
            failed_.store(true);
        }
        for (mailbox& box : boxes_) {
            std::lock_guard lock(box.mutex);
            box.ready.notify_all();
        }
    }

    std::uint64_t next_sequence(rank_t me) noexcept {
        return sequences_[static_cast<std::size_t>(me)].fetch_add(1);
    }

private:
    struct mailbox {
        std::mutex mutex;
        std::condition_variable ready;
        std::vector<match_queue<loopback_recv, loopback_message>> from;  // by sender
    };

    mailbox& box_of(rank_t r) { return boxes_[static_cast<std::size_t>(r)]; }

    static void unpost(mailbox& box, loopback_recv& r) noexcept { box.from[static_cast<std::size_t>(r.peer)].unpost(r); }

    static void deliver(loopback_recv& r, std::span<std::byte const> bytes) {
        if (!check_size(r, r.me, bytes.size())) return;
        if (!bytes.empty()) std::memcpy(r.buffer, bytes.data(), bytes.size());
        r.done = true;
    }

    // For a timeout in a collective: the ranks that never reached it, the likely culprits
    // (threads of one process can see every rank's sequence, a real transport cannot).
    std::string laggards(tag_t tag) const {
        if (!is_collective_tag(tag)) return {};
        std::string behind;
        for (rank_t q = 0; q < size(); ++q)
            if (sequences_[static_cast<std::size_t>(q)].load() <= tag_sequence(tag))
                behind += (behind.empty() ? "" : ", ") + std::to_string(q);
        return behind.empty() ? std::string() : "; ranks that have not reached it: " + behind;
    }

    void throw_if_failed(rank_t me) const {
        if (!failed_.load()) return;
        std::lock_guard lock(failure_mutex_);
        failure_.throw_if_failed(me);
    }

    loopback_options options_;
    std::vector<mailbox> boxes_;
    std::vector<std::atomic<std::uint64_t>> sequences_;
    mutable std::mutex failure_mutex_;
    std::atomic<bool> failed_{false};
    group_failure failure_;
};

} // namespace detail

/// One rank's handle on a loopback group. Cheap to copy; not to be used by two threads at
/// once (as with any transport, one thread drives one rank).
class loopback_transport {
public:
    using memory_space = host_memory;

    /// Sends are eager (complete at once); a receive's request waits for its message.
    using request = detail::request_handle<detail::loopback_world, detail::loopback_recv>;

    loopback_transport(std::shared_ptr<detail::loopback_world> world, rank_t rank) noexcept
        : world_(std::move(world)), rank_(rank) {}

    rank_t rank() const noexcept { return rank_; }
    rank_t size() const noexcept { return world_->size(); }
    std::chrono::milliseconds timeout() const noexcept { return world_->options().timeout; }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        detail::check_peer(rank_, peer, size());
        world_->send(rank_, peer, tag, bytes);
        return {};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        detail::check_peer(rank_, peer, size());
        auto r = detail::make_op<detail::loopback_recv>(false, peer, tag, bytes.size());
        r->me = rank_;
        r->buffer = bytes.data();
        world_->post(rank_, r);
        return {world_.get(), std::move(r)};
    }
    std::uint64_t next_sequence() noexcept { return world_->next_sequence(rank_); }
    void abort(char const* reason) noexcept { world_->abort(rank_, reason); }

private:
    std::shared_ptr<detail::loopback_world> world_;
    rank_t rank_;
};

/// A group of `size` loopback ranks; `transport(r)` is rank r's handle.
class loopback_group {
public:
    explicit loopback_group(rank_t size, loopback_options options = {})
        : world_(std::make_shared<detail::loopback_world>(check_size(size), options)) {}
    rank_t size() const noexcept { return world_->size(); }
    loopback_transport transport(rank_t r) const noexcept { return {world_, r}; }
    /// Fails the group on behalf of rank `who`, as if it had died: every wait throws.
    void abort(rank_t who, std::string const& reason) noexcept { world_->abort(who, reason); }

private:
    static rank_t check_size(rank_t size) {
        if (size < 1) throw invalid_argument("loopback_group: size must be at least 1, got " + std::to_string(size));
        return size;
    }
    std::shared_ptr<detail::loopback_world> world_;
};

/// Runs `fn(transport)` for ranks 0..n-1 of a fresh loopback group, one thread each, and
/// waits for all. If a rank throws, the group is aborted (so the others fail fast instead
/// of waiting for their timeout) and, after every thread finished, the first exception
/// thrown is rethrown.
template <class Fn>
    requires std::invocable<Fn&, loopback_transport&>
void run_ranks(rank_t n, Fn&& fn, loopback_options options = {}) {
    loopback_group group(n, options);
    std::mutex mutex;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (rank_t r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
            loopback_transport tp = group.transport(r);
            try {
                std::invoke(fn, tp);
            } catch (std::exception const& e) {
                {
                    std::lock_guard lock(mutex);
                    if (!first) first = std::current_exception();
                }
                group.abort(r, e.what());
            } catch (...) {
                {
                    std::lock_guard lock(mutex);
                    if (!first) first = std::current_exception();
                }
                group.abort(r, "unknown exception");
            }
        });
    }
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
}

} // namespace chorus
