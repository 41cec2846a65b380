// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Nonblocking collectives: iallreduce, ibroadcast, iallgather, ireduce_scatter, ialltoall,
// ialltoallv, ibarrier. Each returns a chorus::collective_request at once; wait() returns when
// the collective completed on this rank, test() says whether it has.
//
//   auto r = chorus::iallreduce(tp, grads);   // starts: the first steps' messages are posted
//   compute();                                 // call r.test() now and then to move it on
//   r.wait();                                  // grads holds the sum
//
// How: the collective's ordinary schedule runs on a fiber (detail/fiber.hpp) in the calling
// thread, over a view of the transport whose waits do not block: a wait whose message has not
// arrived hands control back. The collective's tag is drawn when it starts, so every rank
// matches its i-collectives in the order it started them, whatever order it waits in.
// Progress happens inside chorus: test() or wait() of any collective_request (or
// chorus::progress()) moves every collective in flight on this thread one step further, as in
// MPI. wait() on the only collective in flight blocks in the transport, as a blocking
// collective would; with several in flight it polls them all, yielding the CPU between rounds.
//
// Rules: the buffers stay valid and untouched until wait() returned (or test() said true);
// the request is used, and destroyed, on the thread that started it (its fiber and the list of
// collectives in flight belong to that thread); a request destroyed before completing
// aborts the group (as a point-to-point request does). A rank blocked outside chorus's
// requests (in a blocking receive, or computing without test()) does not move its
// i-collectives on, and a peer waiting for them waits, at most its timeout.

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/collectives.hpp>
#include <chorus/detail/fiber.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/ranges.hpp>
#include <chorus/reduce/ops.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {

/// One nonblocking collective: its fiber, and how it ended.
class nonblocking_state {
public:
    nonblocking_state(std::function<void(nonblocking_state&)> body, std::function<void(char const*)> abort,
                      std::string name)
        : fiber_([this, b = std::move(body)] { run(b); }), abort_(std::move(abort)), name_(std::move(name)),
          owner_(std::this_thread::get_id()) {}
    nonblocking_state(nonblocking_state const&) = delete;
    nonblocking_state& operator=(nonblocking_state const&) = delete;
    ~nonblocking_state() { forget(); }

    bool finished() const noexcept { return fiber_.finished(); }
    std::string const& name() const noexcept { return name_; }

    /// Registers with this thread's collectives in flight and runs the first steps.
    void start() {
        in_flight().push_back(this);
        step(false);
    }

    /// Runs the fiber until its next wait for a message; `may_block`: its waits may block in
    /// the transport (nothing else is in flight to move on meanwhile).
    void step(bool may_block) noexcept {
        if (finished()) return;
        may_block_ = may_block;
        fiber_.resume();
        if (finished()) forget();
    }

    bool may_block() const noexcept { return may_block_; }

    void check_thread() const {
        if (std::this_thread::get_id() != owner_)
            throw invalid_argument(name_ + ": a nonblocking collective's request must be waited for or tested on "
                                           "the thread that started it");
    }

    void rethrow() const {
        if (error_) std::rethrow_exception(error_);
    }

    /// Destroyed before it completed: the group fails (the peers would wait for its messages),
    /// then the fiber runs to its end, every wait failing at once.
    void abandon() noexcept {
        if (finished()) return;
        std::string const why = "abandoned a pending " + name_ + " (its request was destroyed before it completed)";
        abort_(why.c_str());
        while (!finished()) step(true);
    }

    /// This thread's collectives in flight, in the order they started.
    static std::vector<nonblocking_state*>& in_flight() noexcept {
        thread_local std::vector<nonblocking_state*> list;
        return list;
    }

private:
    void run(std::function<void(nonblocking_state&)> const& body) noexcept {
        try {
            body(*this);
        } catch (...) {
            error_ = std::current_exception();
        }
    }
    void forget() noexcept { std::erase(in_flight(), this); }

    fiber fiber_;
    std::function<void(char const*)> abort_;
    std::string name_;
    std::thread::id owner_;
    std::exception_ptr error_;
    bool may_block_ = false;
};

/// One step of every collective in flight on this thread; whether any finished.
inline bool progress_in_flight() {
    auto const list = nonblocking_state::in_flight();  // a copy: finishing ones leave the list
    bool any = false;
    for (auto* s : list) {
        s->step(false);
        any = any || s->finished();
    }
    return any;
}

/// The transport a nonblocking collective's schedule runs over: `Transport` with the
/// collective's tag drawn at its start, and waits that hand control back while their message
/// has not come.
template <transport Transport>
class nonblocking_view {
public:
    using memory_space = typename Transport::memory_space;

    class request {
    public:
        request(typename Transport::request inner, nonblocking_view const* view) : inner_(std::move(inner)), view_(view) {}
        void wait() {
            auto const start = std::chrono::steady_clock::now();
            while (!inner_.test()) {
                // Alone in flight and waited for, or past the transport's timeout: the transport's
                // own wait (which blocks, and fails with its own message, naming whom it blamed).
                if (view_->state_->may_block() || std::chrono::steady_clock::now() - start > view_->patience_) {
                    inner_.wait();
                    return;
                }
                fiber::yield();
            }
        }
        bool test() { return inner_.test(); }

    private:
        typename Transport::request inner_;
        nonblocking_view const* view_;
    };

    nonblocking_view(Transport& tp, std::uint64_t sequence, nonblocking_state* state, std::chrono::milliseconds patience)
        : tp_(&tp), sequence_(sequence), state_(state), patience_(patience) {}

    rank_t rank() const noexcept { return tp_->rank(); }
    rank_t size() const noexcept { return tp_->size(); }
    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) { return {tp_->isend(peer, tag, bytes), this}; }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) { return {tp_->irecv(peer, tag, bytes), this}; }
    /// The sequence number drawn when the collective started (a collective draws one).
    std::uint64_t next_sequence() noexcept { return sequence_; }
    void abort(char const* reason) noexcept { tp_->abort(reason); }
    std::chrono::milliseconds timeout() const noexcept { return patience_; }
    /// The transport's ring segments (detail::ring_segment_bytes_of): the ring cuts the same
    /// messages in both forms.
    std::size_t ring_segment_bytes() const noexcept { return detail::ring_segment_bytes_of(*tp_); }

private:
    Transport* tp_;
    std::uint64_t sequence_;
    nonblocking_state* state_;
    std::chrono::milliseconds patience_;
};

template <transport Transport>
std::chrono::milliseconds patience_of(Transport const& tp) {
    if constexpr (requires { tp.timeout(); }) {
        auto const t = std::chrono::milliseconds(tp.timeout());
        return t.count() > 0 ? t : std::chrono::milliseconds::max() / 2;  // 0: no timeout
    } else {
        return std::chrono::seconds(30);
    }
}

} // namespace detail

/// A nonblocking collective in flight (or done). Move-only.
class collective_request {
public:
    collective_request() = default;
    explicit collective_request(std::unique_ptr<detail::nonblocking_state> state) noexcept : state_(std::move(state)) {}
    collective_request(collective_request&&) noexcept = default;
    collective_request& operator=(collective_request&& other) noexcept {
        if (this != &other) {
            if (state_) state_->abandon();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    /// A collective still in flight is abandoned: the group fails on every rank.
    ~collective_request() {
        if (state_) state_->abandon();
    }

    /// Returns once the collective completed on this rank, moving every collective in flight
    /// on this thread on meanwhile; throws what the collective threw (a timeout, a peer's
    /// failure, bad arguments). A second wait() returns at once.
    void wait() {
        if (!state_) return;
        state_->check_thread();
        int idle_rounds = 0;
        while (!state_->finished()) {
            if (detail::nonblocking_state::in_flight().size() == 1) {
                state_->step(true);  // alone: block in the transport
                continue;
            }
            if (detail::progress_in_flight()) {
                idle_rounds = 0;
                continue;
            }
            // Nothing finished: yield the CPU, then sleep a little longer each round (at most
            // 100 us), so that ranks sharing cores with ours get them.
            if (++idle_rounds < 64) std::this_thread::yield();
            else std::this_thread::sleep_for(std::chrono::microseconds(std::min(idle_rounds - 63, 100)));
        }
        finish();
    }

    /// Whether the collective completed; moves every collective in flight on this thread one
    /// step. Throws what the collective threw.
    bool test() {
        if (!state_) return true;
        state_->check_thread();
        if (!state_->finished()) detail::progress_in_flight();
        if (!state_->finished()) return false;
        finish();
        return true;
    }

private:
    void finish() {
        auto const s = std::move(state_);
        s->rethrow();
    }

    std::unique_ptr<detail::nonblocking_state> state_;
};

/// One step of every nonblocking collective in flight on this thread (as test() on each).
inline void progress() { detail::progress_in_flight(); }

namespace detail {

/// Starts `body(view)` as a nonblocking collective over `tp`: draws its tag now.
template <transport Transport, class Body>
collective_request start_nonblocking(Transport& tp, char const* name, Body body) {
    std::uint64_t const sequence = tp.next_sequence();
    auto const patience = patience_of(tp);
    auto state = std::make_unique<nonblocking_state>(
        [&tp, sequence, patience, body = std::move(body)](nonblocking_state& self) mutable {
            nonblocking_view<Transport> view(tp, sequence, &self, patience);
            body(view);
        },
        [&tp](char const* reason) {
            std::string const what = "rank " + std::to_string(tp.rank()) + " " + reason;
            tp.abort(what.c_str());
        },
        std::string(name) + " #" + std::to_string(sequence & sequence_mask));
    state->start();
    return collective_request(std::move(state));
}

} // namespace detail

/// allreduce, started: `data` must stay valid and untouched until the request completed.
/// The buffers of every i-collective are lvalues or views (borrowed ranges): a temporary would
/// be gone before the collective is.
template <class Algo = automatic, transport Transport, writable_message_range R, class Op = sum>
    requires std::ranges::borrowed_range<R>
collective_request iallreduce(Transport& tp, R&& data, Op op = {}) {
    auto const s = detail::to_span(data);
    return detail::start_nonblocking(tp, "iallreduce", [s, op](auto& view) { chorus::allreduce<Algo>(view, s, op); });
}

/// broadcast, started.
template <class Algo = automatic, transport Transport, writable_message_range R>
    requires std::ranges::borrowed_range<R>
collective_request ibroadcast(Transport& tp, R&& data, rank_t root) {
    auto const s = detail::to_span(data);
    return detail::start_nonblocking(tp, "ibroadcast", [s, root](auto& view) { chorus::broadcast<Algo>(view, s, root); });
}

/// allgather, started.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::ranges::borrowed_range<S> && std::ranges::borrowed_range<R> &&
             std::same_as<detail::element_t<S>, detail::element_t<R>>
collective_request iallgather(Transport& tp, S&& send, R&& recv) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    return detail::start_nonblocking(tp, "iallgather", [in, out](auto& view) { chorus::allgather<Algo>(view, in, out); });
}

/// reduce_scatter, started.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R, class Op = sum>
    requires std::ranges::borrowed_range<S> && std::ranges::borrowed_range<R> &&
             std::same_as<detail::element_t<S>, detail::element_t<R>>
collective_request ireduce_scatter(Transport& tp, S&& send, R&& recv, Op op = {}) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    return detail::start_nonblocking(tp, "ireduce_scatter",
                                     [in, out, op](auto& view) { chorus::reduce_scatter<Algo>(view, in, out, op); });
}

/// alltoall, started.
template <class Algo = automatic, transport Transport, message_range S, writable_message_range R>
    requires std::ranges::borrowed_range<S> && std::ranges::borrowed_range<R> &&
             std::same_as<detail::element_t<S>, detail::element_t<R>>
collective_request ialltoall(Transport& tp, S&& send, R&& recv) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    return detail::start_nonblocking(tp, "ialltoall", [in, out](auto& view) { chorus::alltoall<Algo>(view, in, out); });
}

/// alltoallv, started. The counts are copied: they may go once it returned.
template <class Algo = automatic, transport Transport, message_range S, count_range SendCounts,
          writable_message_range R, count_range RecvCounts>
    requires std::ranges::borrowed_range<S> && std::ranges::borrowed_range<R> &&
             std::same_as<detail::element_t<S>, detail::element_t<R>>
collective_request ialltoallv(Transport& tp, S&& send, SendCounts const& send_counts, R&& recv,
                              RecvCounts const& recv_counts) {
    auto const in = detail::to_const_span(send);
    auto const out = detail::to_span(recv);
    std::vector<long long> sc(std::ranges::begin(send_counts), std::ranges::end(send_counts));
    std::vector<long long> rc(std::ranges::begin(recv_counts), std::ranges::end(recv_counts));
    return detail::start_nonblocking(tp, "ialltoallv", [in, out, sc = std::move(sc), rc = std::move(rc)](auto& view) {
        chorus::alltoallv<Algo>(view, in, sc, out, rc);
    });
}

/// barrier, started: done once every rank started it.
template <class Algo = automatic, transport Transport>
collective_request ibarrier(Transport& tp) {
    return detail::start_nonblocking(tp, "ibarrier", [](auto& view) { chorus::barrier<Algo>(view); });
}

} // namespace chorus
