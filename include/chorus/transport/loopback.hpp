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
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <chorus/detail/request_handle.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

struct loopback_options {
    /// How long any wait may block before it fails with timeout_error (Gloo's default).
    std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

namespace detail {

struct loopback_recv {
    rank_t me = 0;  // the receiving rank
    rank_t src = 0;
    tag_t tag = 0;
    std::span<std::byte> buffer;
    bool done = false;
    bool posted = false;
    errc error{};  // errc{} = no error
    std::string message;
};

class loopback_world {
public:
    loopback_world(rank_t size, loopback_options options)
        : options_(options), boxes_(static_cast<std::size_t>(size)), sequences_(static_cast<std::size_t>(size)) {}

    rank_t size() const noexcept { return static_cast<rank_t>(boxes_.size()); }
    loopback_options const& options() const noexcept { return options_; }

    void send(rank_t from, rank_t to, tag_t tag, std::span<std::byte const> bytes) {
        mailbox& box = box_of(to);
        std::lock_guard lock(box.mutex);
        throw_if_failed(from);
        for (auto it = box.posted.begin(); it != box.posted.end(); ++it) {
            loopback_recv& r = **it;
            if (r.src != from) continue;
            if (r.tag == tag) {
                deliver(r, to, bytes);
                r.posted = false;
                box.posted.erase(it);
                box.ready.notify_all();
                return;
            }
            if (tags_conflict(r.tag, tag)) {
                // The receiver is waiting for this collective but the sender is in another.
                fail(r, errc::tag_mismatch, collective_mismatch_message(to, r.tag, from, tag));
                r.posted = false;
                box.posted.erase(it);
                box.ready.notify_all();
                break;  // keep the message: the receiver's error names it already
            }
        }
        box.unexpected.push_back({from, tag, std::vector<std::byte>(bytes.begin(), bytes.end())});
    }

    void post(rank_t me, std::shared_ptr<loopback_recv> const& r) {
        mailbox& box = box_of(me);
        std::lock_guard lock(box.mutex);
        throw_if_failed(me);
        for (auto it = box.unexpected.begin(); it != box.unexpected.end(); ++it) {
            if (it->src != r->src) continue;
            if (it->tag == r->tag) {
                deliver(*r, me, it->bytes);
                box.unexpected.erase(it);
                return;
            }
            if (tags_conflict(r->tag, it->tag)) {
                fail(*r, errc::tag_mismatch, collective_mismatch_message(me, r->tag, it->src, it->tag));
                return;
            }
        }
        r->posted = true;
        box.posted.push_back(r);
    }

    // Blocks until r completes, the group fails, or the timeout passes; throws on failure.
    void wait(std::shared_ptr<loopback_recv> const& r) {
        rank_t const me = r->me;
        mailbox& box = box_of(me);
        std::unique_lock lock(box.mutex);
        auto const deadline = std::chrono::steady_clock::now() + options_.timeout;
        bool const finished = box.ready.wait_until(lock, deadline, [&] { return r->done || failed_.load(); });
        if (r->done) {
            if (r->error == errc{}) return;
            std::string const what = r->message;
            errc const e = r->error;
            lock.unlock();
            abort(me, what);
            throw transport_error(e, r->src, what);
        }
        if (finished) {  // the group failed while we waited
            unpost(box, r);
            throw_if_failed(me);
        }
        unpost(box, r);
        std::string const what = timeout_message(me, *r);
        lock.unlock();
        abort(me, what);
        throw timeout_error(r->src, what);
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
            unpost(box, r);
        }
        if (was_pending) abort(me, abandoned_message(me, /*is_send=*/false, r->tag, r->src));
    }

    /// Marks the group failed on behalf of `who`; the first reason is kept.
    void abort(rank_t who, std::string const& reason) noexcept {
        {
            std::lock_guard lock(failure_mutex_);
            if (failed_.load()) return;
            failed_rank_ = who;
            failure_ = reason;
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
    struct message {
        rank_t src;
        tag_t tag;
        std::vector<std::byte> bytes;
    };
    struct mailbox {
        std::mutex mutex;
        std::condition_variable ready;
        std::deque<message> unexpected;
        std::list<std::shared_ptr<loopback_recv>> posted;
    };

    mailbox& box_of(rank_t r) { return boxes_[static_cast<std::size_t>(r)]; }

    static void unpost(mailbox& box, std::shared_ptr<loopback_recv> const& r) {
        if (!r->posted) return;
        box.posted.remove(r);
        r->posted = false;
    }

    static void fail(loopback_recv& r, errc e, std::string message) {
        r.error = e;
        r.message = std::move(message);
        r.done = true;
    }

    static void deliver(loopback_recv& r, rank_t me, std::span<std::byte const> bytes) {
        if (bytes.size() != r.buffer.size()) {
            fail(r, errc::size_mismatch, size_mismatch_message(me, bytes.size(), r.src, r.tag, r.buffer.size()));
            return;
        }
        if (!bytes.empty()) std::memcpy(r.buffer.data(), bytes.data(), bytes.size());
        r.done = true;
    }

    std::string timeout_message(rank_t me, loopback_recv const& r) const {
        std::string what = "rank " + std::to_string(me) + ": timed out after " +
                           std::to_string(options_.timeout.count()) + " ms waiting for rank " +
                           std::to_string(r.src) + " (" + describe_tag(r.tag) + ")";
        if (is_collective_tag(r.tag)) {
            // Name the ranks that never reached this collective: they are the likely culprits.
            std::string behind;
            for (rank_t q = 0; q < size(); ++q)
                if (sequences_[static_cast<std::size_t>(q)].load() <= tag_sequence(r.tag))
                    behind += (behind.empty() ? "" : ", ") + std::to_string(q);
            if (!behind.empty()) what += "; ranks that have not reached it: " + behind;
        }
        return what;
    }

    void throw_if_failed(rank_t me) const {
        if (!failed_.load()) return;
        std::lock_guard lock(failure_mutex_);
        if (failed_rank_ == me)
            throw transport_error(errc::aborted, me, "rank " + std::to_string(me) + " aborted earlier: " + failure_);
        throw transport_error(errc::peer_failed, failed_rank_,
                              "rank " + std::to_string(me) + ": the group failed at rank " +
                                  std::to_string(failed_rank_) + ": " + failure_);
    }

    loopback_options options_;
    std::vector<mailbox> boxes_;
    std::vector<std::atomic<std::uint64_t>> sequences_;
    mutable std::mutex failure_mutex_;
    std::atomic<bool> failed_{false};
    rank_t failed_rank_ = -1;
    std::string failure_;
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
        check_peer(peer);
        world_->send(rank_, peer, tag, bytes);
        return {};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        check_peer(peer);
        auto r = std::make_shared<detail::loopback_recv>();
        r->me = rank_;
        r->src = peer;
        r->tag = tag;
        r->buffer = bytes;
        world_->post(rank_, r);
        return {world_.get(), std::move(r)};
    }
    std::uint64_t next_sequence() noexcept { return world_->next_sequence(rank_); }
    void abort(char const* reason) noexcept { world_->abort(rank_, reason); }

private:
    void check_peer(rank_t peer) const {
        if (peer < 0 || peer >= size())
            throw invalid_argument(detail::peer_range_message(rank_, peer, size()));
    }

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
