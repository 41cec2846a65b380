// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// staged_engine<Device>: the engine of the transports whose ranks share memory that only a
// device can copy (CUDA IPC): messages move through per-peer FIFOs in the receiver's memory,
// and a tcp_transport carries the little that must cross between processes — the FIFO handles
// once, at set-up, then one header per chunk and the credits that free the slots.
//
// Protocol, for one ordered pair of ranks s -> r (the pair s -> s, messages to self, too):
// - r owns a FIFO for s: `slots` slots of `chunk` bytes in its memory, exported once
//   (Device::export_handle) and opened by s (Device::open_handle).
// - s sends its messages in the order they were posted. A message is cut into chunks; for
//   each, s takes a free slot (a credit), enqueues a copy from its buffer into that slot of
//   r's FIFO, and records an event. Once the event has completed, s sends r the chunk's header
//   (tag, message size, offset, length, slot) over the control channel. The send is complete
//   when the copies of all its chunks are: its buffer may be reused.
// - r reads the headers in order. The first chunk of a message matches the oldest receive
//   posted for (s, tag), whose size must equal the message's, or else is unexpected: it is
//   staged in a scratch allocation until the receive is posted. r enqueues a copy from the
//   slot to the receive buffer; once it completed, the slot goes back to s as a credit and,
//   after the last chunk, the receive is complete.
// Ordering needs no more than this: copies on one rank complete in the order they were
// enqueued (one stream), headers and credits travel in order (one tcp tag each), and the
// slots are used round robin. Progress happens in the caller's thread, in every wait and test
// (on every peer, so that a rank blocked on one message still drains the others' chunks).
// Errors: a failed control operation (a peer died, aborted or timed out) fails the whole
// engine, and so does a device error (its text goes to the peers) or a call from a thread
// whose current device is not the engine's; a size or collective mismatch fails its receive
// and, when waited for, the group.
//
// Cost per chunk: one device copy each side plus one control message each way (tens of
// microseconds over loopback TCP); with `slots` chunks in flight per peer, copies of later
// chunks overlap the control latency of earlier ones, so large messages pipeline.
//
// Device (a policy, see cuda_ipc.hpp for the CUDA one and tests/support for a host model):
//   using memory_space; using handle (trivially copyable); using event;
//   void* allocate_shared(std::size_t bytes);  void release_shared(void*) noexcept;  // exportable
//   void abandon_shared(void*) noexcept;       // peers may still have it open: never free it
//   void check_current();                      // throws unless the caller may use the device
//   scoped_current() noexcept;                 // RAII: the device is current while it lives
//   void* allocate(std::size_t bytes);         void release(void*) noexcept;         // staging
//   handle export_handle(void* base);          void* open_handle(handle const&);
//   void close_handle(void*) noexcept;
//   void copy(void* dst, void const* src, std::size_t bytes);  // enqueued, in order
//   event record();  bool done(event&);  void release(event&) noexcept;
//   void synchronize() noexcept;                // everything enqueued has completed

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/detail/request_handle.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus::detail {

/// One isend or irecv of a staged_engine.
struct staged_op {
    bool is_send = false;
    rank_t peer = 0;
    tag_t tag = 0;
    std::byte* in = nullptr;         // receive buffer
    std::byte const* out = nullptr;  // send buffer
    std::size_t size = 0;
    std::size_t enqueued = 0;   // send: bytes whose copy was enqueued
    std::size_t completed = 0;  // bytes whose copy completed
    bool matched = false;       // receive: a message was assigned to it (or it failed)
    bool done = false;
    errc error{};
    rank_t error_peer = -1;
    std::string message;
};

/// What the control channel carries: a chunk's header, credits, or the goodbye.
struct staged_control {
    enum kind_t : std::uint64_t { chunk = 1, credit = 2, bye = 3 };
    std::uint64_t kind;
    std::uint64_t tag;
    std::uint64_t total;   // chunk: the message's size in bytes
    std::uint64_t offset;  // chunk: its offset in the message
    std::uint64_t length;  // chunk: its length (0 only for a zero-length message); credit: slots freed
    std::uint64_t slot;
};
static_assert(std::is_trivially_copyable_v<staged_control>);

struct staged_config {
    /// Bytes per FIFO slot and slots per peer: up to `slots` chunks per peer are in flight.
    std::size_t chunk = std::size_t{1} << 21;
    std::size_t slots = 8;
};

template <class Device>
class staged_engine {
public:
    using op_ptr = std::shared_ptr<staged_op>;

    /// `control` is the control channel, connected; it must have no messages in flight (the
    /// engine uses its tags 1 and 2). Starts the exchange of FIFO handles with every peer.
    staged_engine(tcp_transport&& control, staged_config config, Device device)
        : device_(std::move(device)), chunk_(config.chunk), slots_(config.slots), timeout_(control.timeout()) {
        if (chunk_ == 0 || slots_ == 0) throw invalid_argument("staged transport: chunk and slots must be positive");
        control_.emplace(std::move(control));
        me_ = control_->rank();
        peers_.resize(static_cast<std::size_t>(control_->size()));
        // One allocation holds the FIFOs of all senders, self included: region s is s's.
        fifo_ = device_.allocate_shared(peers_.size() * region_bytes());
        try {
            exchange_handles();
            for (rank_t r = 0; r < size(); ++r) post_control_receive(r);
        } catch (...) {
            close_peers();
            device_.abandon_shared(fifo_);  // a peer may have opened it already
            throw;
        }
    }

    staged_engine(staged_engine const&) = delete;
    staged_engine& operator=(staged_engine const&) = delete;

    ~staged_engine() {
        // Say goodbye, and wait for every peer's: a peer says it only once its copies into our
        // FIFO completed and it closed our memory, so only then is the FIFO released. Sends
        // still queued (their requests were abandoned, which failed the group) stay unsent.
        // A failed group skips the goodbye: its control requests fail at once.
        // Without every goodbye a peer may still have the FIFO open, or copies into it queued:
        // freeing memory another process maps is undefined, so it is abandoned instead (for
        // CUDA: reclaimed when the process exits).
        [[maybe_unused]] auto const current = device_.scoped_current();  // whichever thread destroys it
        closing_ = true;
        device_.synchronize();
        close_peers();
        bool all_said_bye = false;
        if (!failure_) {
            try {
                all_said_bye = goodbye();
            } catch (...) {
            }
        }
        device_.synchronize();
        for (auto& q : peers_) release_device_state(q);
        // Control requests still pending (a peer that never said goodbye: it timed out, or the
        // group failed) end with the control channel. Cancelling them would abort the group on
        // every rank, and a rank that leaves is not a failure. Their buffers outlive it.
        for (auto& q : peers_) {
            for (auto& c : q.control_sends) c.request->detach();
            for (auto* r : {&q.control_in, &q.handle_in, &q.handle_out})
                if (*r) (*r)->detach();
        }
        control_.reset();
        if (all_said_bye) device_.release_shared(fifo_);
        else device_.abandon_shared(fifo_);
    }

    rank_t rank() const noexcept { return me_; }
    rank_t size() const noexcept { return static_cast<rank_t>(peers_.size()); }
    rank_t local_rank() const noexcept { return control_->local_rank(); }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    std::uint64_t next_sequence() noexcept { return sequence_++; }
    Device& device() noexcept { return device_; }

    op_ptr isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        check_peer(peer);
        throw_if_failed();
        check_device();
        auto op = std::make_shared<staged_op>();
        op->is_send = true;
        op->peer = peer;
        op->tag = tag;
        op->out = bytes.data();
        op->size = bytes.size();
        peer_of(peer).sends.push_back(op);
        try {
            progress_sends(peer);
        } catch (error const&) {  // a device or control error: the engine fails (the op with it)
            fail_engine();
            throw;
        }
        return op;
    }

    op_ptr irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        check_peer(peer);
        throw_if_failed();
        check_device();
        auto op = std::make_shared<staged_op>();
        op->peer = peer;
        op->tag = tag;
        op->in = bytes.data();
        op->size = bytes.size();
        peer_state& q = peer_of(peer);
        // Messages that arrived first are older than any still to come: they match first.
        for (auto& u : q.unexpected) {
            if (u->receiver) continue;
            if (u->tag == tag) {
                op->matched = true;
                if (u->total != op->size)
                    fail(*op, errc::size_mismatch, size_mismatch_message(me_, u->total, peer, tag, op->size));
                else
                    u->receiver = op;
                try {
                    drain_unexpected(q);
                } catch (error const&) {
                    fail_engine();
                    throw;
                }
                return op;
            }
            if (tags_conflict(tag, u->tag)) {
                op->matched = true;
                fail(*op, errc::tag_mismatch, collective_mismatch_message(me_, tag, peer, u->tag));
                return op;
            }
        }
        q.recvs.push_back(op);
        return op;
    }

    void wait(op_ptr const& op) {
        check_device();
        auto const deadline = clock::now() + timeout_;
        for (;;) {
            progress();
            if (op->done) break;
            if (failure_) {
                unpost(*op);
                std::rethrow_exception(failure_);
            }
            if (clock::now() > deadline) {
                unpost(*op);
                std::string const what = wait_timeout_message(me_, timeout_.count(), op->peer, op->is_send, op->tag);
                abort(what);
                throw timeout_error(op->peer, what);
            }
            std::this_thread::yield();
        }
        if (op->error != errc{}) {
            abort(op->message);
            throw transport_error(op->error, op->error_peer, op->message);
        }
    }

    bool test(op_ptr const& op) {
        check_device();
        progress();
        if (!op->done && !failure_) return false;
        wait(op);  // returns or throws at once
        return true;
    }

    void cancel(op_ptr const& op) noexcept {
        if (op->done) return;
        unpost(*op);
        abort(abandoned_message(me_, op->is_send, op->tag, op->peer));
    }

    void abort(std::string const& reason) noexcept {
        try {
            control_->abort(reason.c_str());
            if (!failure_) failure_ = std::make_exception_ptr(transport_error(errc::peer_failed, me_, reason));
        } catch (...) {
        }
    }

private:
    using clock = std::chrono::steady_clock;
    using control_request = tcp_transport::request;
    static constexpr tag_t control_tag = 1, handle_tag = 2;

    struct unexpected_message {
        tag_t tag = 0;
        std::size_t total = 0, arrived = 0;  // bytes whose copy into `buffer` completed
        void* buffer = nullptr;
        op_ptr receiver;  // the irecv that matched it later
        std::optional<typename Device::event> drain;  // the copy buffer -> receiver
    };
    using unexpected_ptr = std::shared_ptr<unexpected_message>;

    struct chunk_copy {
        typename Device::event event;
        staged_control header;
        op_ptr op;           // the send or receive the chunk belongs to (may have failed)
        unexpected_ptr staged;  // or the unexpected message it is staged into
    };
    struct control_send {
        std::unique_ptr<staged_control> message;
        std::optional<control_request> request;
    };
    struct peer_state {
        // towards the peer
        std::byte* remote = nullptr;  // our region of the peer's FIFO
        void* opened = nullptr;       // the peer's FIFO as open_handle returned it (not for self)
        std::size_t credits = 0, next_slot = 0;
        std::deque<op_ptr> sends;             // posted, not all chunks enqueued
        std::deque<chunk_copy> send_copies;   // enqueued, header not sent yet
        std::deque<control_send> control_sends;
        // from the peer
        staged_control in{};
        std::optional<control_request> control_in;
        std::optional<control_request> handle_in, handle_out;  // set-up, see exchange_handles
        bool said_bye = false;
        std::deque<op_ptr> recvs;  // posted, not matched yet
        op_ptr current;            // the receive the arriving message goes to, or
        unexpected_ptr current_staged;
        std::deque<chunk_copy> recv_copies;
        std::deque<unexpected_ptr> unexpected;
        std::uint64_t credits_owed = 0;
    };

    std::size_t region_bytes() const noexcept { return chunk_ * slots_; }
    peer_state& peer_of(rank_t r) noexcept { return peers_[static_cast<std::size_t>(r)]; }

    void check_peer(rank_t peer) const {
        if (peer < 0 || peer >= size()) throw invalid_argument(peer_range_message(me_, peer, size()));
    }

    void throw_if_failed() const {
        if (failure_) std::rethrow_exception(failure_);
    }

    // Posts the exchange of FIFO handles; progress() opens each peer's when it arrived. Not
    // waited for here: a peer that finishes its set-up and fails at once (aborts) must fail
    // our next operation, not our construction.
    void exchange_handles() {
        own_handle_ = device_.export_handle(fifo_);
        handles_.resize(peers_.size());
        for (rank_t r = 0; r < size(); ++r) {
            peer_state& q = peer_of(r);
            q.credits = slots_;
            if (r == me_) {
                q.remote = static_cast<std::byte*>(fifo_) + static_cast<std::size_t>(me_) * region_bytes();
                continue;
            }
            q.handle_in.emplace(control_->irecv(r, handle_tag, std::as_writable_bytes(std::span(&handles_[static_cast<std::size_t>(r)], 1))));
            q.handle_out.emplace(control_->isend(r, handle_tag, std::as_bytes(std::span(&own_handle_, 1))));
        }
    }

    void open_peer(rank_t r) {
        peer_state& q = peer_of(r);
        if (q.handle_out && q.handle_out->test()) q.handle_out.reset();
        if (closing_ || q.remote || !q.handle_in || !q.handle_in->test()) return;
        q.handle_in.reset();
        q.opened = device_.open_handle(handles_[static_cast<std::size_t>(r)]);
        q.remote = static_cast<std::byte*>(q.opened) + static_cast<std::size_t>(me_) * region_bytes();
    }

    void close_peers() noexcept {
        for (auto& q : peers_) {
            if (q.opened) device_.close_handle(std::exchange(q.opened, nullptr));
        }
    }

    // The events and staging buffers still held for this peer (at destruction).
    void release_device_state(peer_state& q) noexcept {
        for (auto& c : q.send_copies) device_.release(c.event);
        for (auto& c : q.recv_copies) device_.release(c.event);
        for (auto& u : q.unexpected)
            if (u->drain) device_.release(*u->drain);
        q.send_copies.clear();
        q.recv_copies.clear();
        for (auto& u : q.unexpected)
            if (u->buffer) device_.release(u->buffer);
        q.unexpected.clear();
        q.current_staged.reset();
    }

    // True once every peer said goodbye (its copies into our FIFO are complete, it closed it).
    bool goodbye() {
        for (rank_t r = 0; r < size(); ++r) send_control(r, {staged_control::bye, 0, 0, 0, 0, 0});
        auto const deadline = clock::now() + timeout_;
        auto const finished = [&] {
            for (auto& q : peers_)
                if (!q.said_bye || !q.control_sends.empty()) return false;
            return true;
        };
        while (!finished() && clock::now() < deadline) {
            progress();
            if (failure_) return false;
            std::this_thread::yield();
        }
        return finished();
    }

    std::byte* local_slot(rank_t from, std::size_t slot) const noexcept {
        return static_cast<std::byte*>(fifo_) + static_cast<std::size_t>(from) * region_bytes() + slot * chunk_;
    }

    void post_control_receive(rank_t r) {
        peer_state& q = peer_of(r);
        q.control_in.emplace(control_->irecv(r, control_tag, std::as_writable_bytes(std::span(&q.in, 1))));
    }

    static void fail(staged_op& op, errc e, std::string message) {
        op.error = e;
        op.error_peer = op.peer;
        op.message = std::move(message);
        op.matched = true;
        op.done = true;
    }

    // Copies and events must go to the device the FIFOs live on: a thread whose current device
    // is another one fails here, and the group with it, rather than misplacing work.
    void check_device() {
        try {
            device_.check_current();
        } catch (error const& e) {
            abort(e.what());
            throw;
        }
    }

    void unpost(staged_op& op) noexcept {
        if (op.is_send || op.matched) return;
        std::erase_if(peer_of(op.peer).recvs, [&](op_ptr const& p) { return p.get() == &op; });
    }

    // One pass over every peer. A failed control operation (a peer died, aborted, or timed
    // out) fails the engine: every wait rethrows it.
    void progress() {
        if (failure_) return;
        try {
            for (rank_t r = 0; r < size(); ++r) {
                peer_state& q = peer_of(r);
                open_peer(r);
                while (!q.said_bye && q.control_in->test()) {
                    on_control(r, q.in);
                    if (!q.said_bye) post_control_receive(r);
                }
                progress_sends(r);
                progress_receives(r);
                std::erase_if(q.control_sends, [](control_send& c) { return c.request->test(); });
            }
        } catch (error const&) {
            fail_engine();
        }
    }

    // In a handler of an engine-failing error: every wait rethrows it from now on. A device
    // error is this rank's own, so the peers are told why (a control error came from them,
    // or from a connection they see fail too).
    void fail_engine() noexcept {
        failure_ = std::current_exception();
        try {
            throw;
        } catch (device_error const& e) {
            control_->abort(e.what());
        } catch (...) {
        }
        for (auto& q : peers_) {
            for (auto& op : q.recvs) op->matched = true;
            q.recvs.clear();
        }
    }

    void send_control(rank_t to, staged_control const& m) {
        control_send c{std::make_unique<staged_control>(m), std::nullopt};
        c.request.emplace(control_->isend(to, control_tag, std::as_bytes(std::span(c.message.get(), 1))));
        if (!c.request->test()) peer_of(to).control_sends.push_back(std::move(c));
    }

    void progress_sends(rank_t r) {
        peer_state& q = peer_of(r);
        while (!closing_ && q.remote && !q.sends.empty()) {
            staged_op& op = *q.sends.front();
            if (op.size == 0) {  // a header alone, in order behind the chunks before it
                q.send_copies.push_back({device_.record(), {staged_control::chunk, op.tag, 0, 0, 0, 0}, q.sends.front(), {}});
                q.sends.pop_front();
                continue;
            }
            if (q.credits == 0) break;
            std::size_t const len = std::min(chunk_, op.size - op.enqueued);
            std::size_t const slot = q.next_slot;
            q.next_slot = (q.next_slot + 1) % slots_;
            --q.credits;
            device_.copy(q.remote + slot * chunk_, op.out + op.enqueued, len);
            q.send_copies.push_back({device_.record(), {staged_control::chunk, op.tag, op.size, op.enqueued, len, slot},
                                     q.sends.front(), {}});
            op.enqueued += len;
            if (op.enqueued == op.size) q.sends.pop_front();
        }
        while (!q.send_copies.empty() && device_.done(q.send_copies.front().event)) {
            chunk_copy& c = q.send_copies.front();
            device_.release(c.event);
            send_control(r, c.header);
            c.op->completed += static_cast<std::size_t>(c.header.length);
            if (c.op->completed == c.op->size) c.op->done = true;
            q.send_copies.pop_front();
        }
    }

    void on_control(rank_t from, staged_control const& m) {
        peer_state& q = peer_of(from);
        if (m.kind == staged_control::bye) {
            q.said_bye = true;
            return;
        }
        if (m.kind == staged_control::credit) {
            q.credits += static_cast<std::size_t>(m.length);
            return;
        }
        if (m.offset == 0) start_message(from, m);
        if (m.length == 0) {  // a zero-length message: nothing to copy
            if (q.current && !q.current->done) q.current->done = true;
            return;
        }
        std::byte* dst = nullptr;
        if (q.current_staged) dst = static_cast<std::byte*>(q.current_staged->buffer) + m.offset;
        else if (q.current && !q.current->done) dst = q.current->in + m.offset;
        // A receive that failed (size mismatch) still frees the message's slots, in order.
        if (dst) device_.copy(dst, local_slot(from, static_cast<std::size_t>(m.slot)), static_cast<std::size_t>(m.length));
        q.recv_copies.push_back({device_.record(), m, q.current, q.current_staged});
    }

    void start_message(rank_t from, staged_control const& m) {
        peer_state& q = peer_of(from);
        q.current.reset();
        q.current_staged.reset();
        for (auto it = q.recvs.begin(); it != q.recvs.end(); ++it) {
            staged_op& op = **it;
            if (op.tag == m.tag) {
                q.current = *it;
                q.recvs.erase(it);
                op.matched = true;
                if (op.size != m.total)
                    fail(op, errc::size_mismatch, size_mismatch_message(me_, static_cast<std::size_t>(m.total), from, m.tag, op.size));
                return;
            }
            if (tags_conflict(op.tag, m.tag)) {
                // The receiver waits for this collective, the sender is in another: the
                // receive fails (its error names both), the message is kept.
                fail(op, errc::tag_mismatch, collective_mismatch_message(me_, op.tag, from, m.tag));
                q.recvs.erase(it);
                break;
            }
        }
        auto u = std::make_shared<unexpected_message>();
        u->tag = m.tag;
        u->total = static_cast<std::size_t>(m.total);
        if (u->total) u->buffer = device_.allocate(u->total);
        q.unexpected.push_back(u);
        q.current_staged = std::move(u);
    }

    void progress_receives(rank_t r) {
        peer_state& q = peer_of(r);
        while (!q.recv_copies.empty() && device_.done(q.recv_copies.front().event)) {
            chunk_copy& c = q.recv_copies.front();
            device_.release(c.event);
            ++q.credits_owed;
            auto const len = static_cast<std::size_t>(c.header.length);
            if (c.staged) {
                c.staged->arrived += len;
            } else if (c.op && !c.op->done) {
                c.op->completed += len;
                if (c.op->completed == c.op->size) c.op->done = true;
            }
            q.recv_copies.pop_front();
        }
        if (q.credits_owed)
            send_control(r, {staged_control::credit, 0, 0, 0, std::exchange(q.credits_owed, 0), 0});
        drain_unexpected(q);
    }

    // Copies the unexpected messages that were matched and arrived whole into their receive
    // buffers, and frees them once delivered.
    void drain_unexpected(peer_state& q) {
        for (auto& u : q.unexpected) {
            if (!u->receiver || u->receiver->done || u->arrived != u->total) continue;
            if (u->total == 0) {
                u->receiver->done = true;
                continue;
            }
            if (!u->drain) {
                device_.copy(u->receiver->in, u->buffer, u->total);
                u->drain.emplace(device_.record());
            }
            if (device_.done(*u->drain)) {
                device_.release(*u->drain);
                u->drain.reset();
                u->receiver->completed = u->total;
                u->receiver->done = true;
            }
        }
        std::erase_if(q.unexpected, [&](unexpected_ptr const& u) {
            if (!u->receiver || !u->receiver->done || u->drain) return false;
            if (u->buffer) device_.release(u->buffer);
            u->buffer = nullptr;
            return true;
        });
    }

    Device device_;
    std::size_t chunk_, slots_;
    std::chrono::milliseconds timeout_;
    std::optional<tcp_transport> control_;
    rank_t me_ = 0;
    void* fifo_ = nullptr;
    typename Device::handle own_handle_{};
    std::vector<typename Device::handle> handles_;  // the peers', as they arrive
    std::vector<peer_state> peers_;
    std::uint64_t sequence_ = 0;
    std::exception_ptr failure_;
    bool closing_ = false;
};

/// A transport over a staged_engine: the staged transports (cuda_ipc_transport) are this
/// with their Device, plus their own construction from the environment.
template <class Device>
class staged_transport {
public:
    using memory_space = typename Device::memory_space;
    using engine = staged_engine<Device>;
    using request = request_handle<engine, staged_op>;

    /// Over a connected control channel (see staged_engine); starts the exchange of FIFO
    /// handles, which completes in the first operations' progress (their timeout bounds it).
    /// An rvalue reference, not a value: `control` is moved from only once every argument
    /// was evaluated.
    staged_transport(tcp_transport&& control, staged_config config, Device device)
        : engine_(std::make_unique<engine>(std::move(control), config, std::move(device))) {}

    rank_t rank() const noexcept { return engine_->rank(); }
    rank_t size() const noexcept { return engine_->size(); }
    rank_t local_rank() const noexcept { return engine_->local_rank(); }
    std::chrono::milliseconds timeout() const noexcept { return engine_->timeout(); }
    Device& device() noexcept { return engine_->device(); }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return {engine_.get(), engine_->isend(peer, tag, bytes)};
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return {engine_.get(), engine_->irecv(peer, tag, bytes)};
    }
    std::uint64_t next_sequence() noexcept { return engine_->next_sequence(); }
    void abort(char const* reason) noexcept {
        try {
            engine_->abort(reason ? reason : "aborted");
        } catch (...) {  // the reason's copy failed to allocate: the group stays as it was
        }
    }

private:
    std::unique_ptr<engine> engine_;
};

} // namespace chorus::detail
