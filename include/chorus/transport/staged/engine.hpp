// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// staged_engine<Device, Control>: the staged protocol (protocol.hpp) over a device (a
// staged_device) and a control channel (a control_transport). Progress happens in the
// caller's thread, in every wait and test, on every peer, so that a rank blocked on one
// message still drains the others' chunks.
//
// Errors: a failed control operation (a peer died, aborted or timed out) fails the whole
// engine, and so does a device error (its text goes to the peers) or a call from a thread
// whose current device is not the engine's; a size or collective mismatch fails its receive
// and, when waited for, the group.
//
// Direct exchanges (exchange(), block(), agreed(): the one_shot collectives) follow protocol.hpp:
// a block is copied into this rank's slot, announced by a control record, and read by the
// peers where it lies. So do rendezvous messages (staged_config::rendezvous_bytes): the
// receiver copies them once from the sender's buffer.
//
// Signaled launches (signal_bytes(), launch(): signals.hpp), where the device runs them and
// every rank asked for them (staged_config::signals): a pad and two more slots behind the direct
// slots, which the device's kernels use with no control message at all.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/detail/matching.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/signals.hpp>
#include <chorus/transport/staged/protocol.hpp>

namespace chorus::detail {

template <staged_device Device, control_transport Control>
class staged_engine {
public:
    using op_ptr = std::shared_ptr<staged_op>;

    /// `control` is the control channel, connected; it must have no messages in flight (the
    /// engine uses its tags 1, 2 and 3). Starts the exchange of FIFO handles with every peer.
    staged_engine(Control&& control, staged_config config, Device device)
        : device_(std::move(device)), chunk_(config.chunk), slots_(config.slots), direct_bytes_(config.direct_bytes),
          rendezvous_bytes_(config.rendezvous_bytes), timeout_(control.timeout()),
          signals_(can_signal && config.signals && config.direct_bytes > 0) {
        if (chunk_ == 0 || slots_ == 0) throw invalid_argument("staged transport: chunk and slots must be positive");
        control_.emplace(std::move(control));
        me_ = control_->rank();
        peers_.resize(static_cast<std::size_t>(control_->size()));
        // One allocation holds the FIFOs of all senders, self included (region s is s's), then
        // the two direct slots, then the signal pad and its two slots.
        fifo_ = device_.allocate_shared(signal_offset() + (signals_ ? pad_stride() + 2 * direct_stride() : 0));
        try {
            if (signals_) {
                zero_pad();
                (void)device_.failure_status();  // now, not inside a capture (where allocating is not allowed)
            }
            exchange_handles();
            for (rank_t r = 0; r < size(); ++r) {
                post_control_receive(r);
                if constexpr (can_expose)
                    if (r != me_) post_exposure_receive(r);
            }
        } catch (transport_error const&) {  // the group failed already: our first operation says so
            failure_ = std::current_exception();
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
            for (auto& c : q.exposure_sends) c.request->detach();
            for (auto* r : {&q.control_in, &q.exposure_in, &q.handle_in, &q.handle_out})
                if (*r) (*r)->detach();
        }
        control_.reset();
        if (all_said_bye) device_.release_shared(fifo_);
        else device_.abandon_shared(fifo_);
    }

    rank_t rank() const noexcept { return me_; }
    rank_t size() const noexcept { return static_cast<rank_t>(peers_.size()); }
    rank_t local_rank() const noexcept {
        if constexpr (requires(Control const& c) { c.local_rank(); }) return control_->local_rank();
        else return me_;  // a control channel without nodes (loopback): every rank is local
    }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// The control channel (host memory): what a split exchanges its ranks' colors over.
    Control& control() noexcept { return *control_; }
    std::uint64_t next_sequence() noexcept { return sequence_++; }
    Device& device() noexcept { return device_; }

    /// The largest block of a direct exchange; 0: none.
    std::size_t direct_bytes() const noexcept { return direct_bytes_; }
    std::size_t rendezvous_bytes() const noexcept { return can_expose ? rendezvous_bytes_ : 0; }

    /// Whether the device runs signaled launches (signals.hpp): `d.launch(args, lanes, body, poll)`,
    /// `d.failure_status()` (the host-visible signal_status its kernels write) and
    /// `d.raise(word, value)` (a store into device memory from the host, beside queued work).
    static constexpr bool can_signal = requires(Device& d, signal_args const& a, std::uint64_t* w) {
        d.launch(a, 1u, signal_probe{}, signal_poll{});
        { d.failure_status() } -> std::same_as<signal_status*>;
        { d.raise(w, std::uint64_t{}) } noexcept;
    };

    /// The largest collective of a signaled launch, the same on every rank: direct_bytes where
    /// every rank asked for signals (each says so in its set-up message, awaited here the first
    /// time), 0 where not, or beyond signal_max_ranks ranks.
    std::size_t signal_bytes() {
        if (!signals_ || size() < 2 || size() > signal_max_ranks) return 0;
        throw_if_failed();
        if (!peers_heard_ && device_capturing()) {
            std::string const what = "staged transport: the first signaled collective inside a CUDA graph capture: the set-up it "
                                     "completes cannot be captured; run one collective before the capture";
            abort(what);
            throw invalid_argument(what);
        }
        await_peers();
        return all_signal_ ? direct_bytes_ : 0;
    }

    /// Throws if the group failed, or a signaled launch failed on the device by now.
    void check_launches() {
        throw_if_failed();
        check_signals();
    }

    /// One signaled launch of `body` for a collective of `bytes` (at most signal_bytes()) whose
    /// shape is `shape` (`describe` says it in words): queued on the device in order with this
    /// rank's other work, not waited for (it may be captured into a CUDA graph). A failure (a
    /// rank that does not come within the timeout, or ranks that called it differently) fails
    /// the group on every rank: the host model's launch runs at once and throws here; a GPU's
    /// throws from the rank's next call into the transport.
    template <class Body>
    void launch(Body const& body, std::size_t bytes, std::uint64_t shape, std::string (*describe)(std::uint64_t))
        requires can_signal
    {
        throw_if_failed();
        check_device(/*capturing=*/true);
        if (std::size_t const most = signal_bytes(); most == 0 || bytes > most) {
            std::string const what = "staged transport: a signaled launch of " + std::to_string(bytes) + " bytes, but signal_bytes() is " +
                                     std::to_string(most);
            abort(what);
            throw invalid_argument(what);
        }
        // Messages in flight are left as they are: a launch waits only for the peers' launches.
        // Their chunks enqueued from now on run after it on the stream (see docs/concepts.md).
        if (!device_capturing()) {
            progress();
            throw_if_failed();
        }
        signal_args a{};
        for (rank_t r = 0; r < size(); ++r) a.base[r] = static_cast<std::byte*>(r == me_ ? fifo_ : peer_of(r).opened);
        a.pad_offset = signal_offset();
        a.slot_offset = signal_offset() + pad_stride();
        a.slot_stride = direct_stride();
        a.shape = shape;
        a.timeout_ns = timeout_.count() > 0  // 0: none
                           ? static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count())
                           : ~std::uint64_t{0};
        a.status = device_.failure_status();
        a.rank = me_;
        a.size = size();
        describe_ = describe;
        launched_ = true;
        // A host model runs the launch in this thread, moving the messages while it waits.
        signal_poll const poll{[](void* self) { static_cast<staged_engine*>(self)->progress(); }, this};
        failing_on_error([&] { device_.launch(a, signal_lanes(bytes, size()), body, poll); });
        throw_if_failed();  // the messages moved meanwhile may have brought a peer's failure
        check_signals();
    }

    /// One round of the direct exchange (transport/concepts.hpp, direct_transport): copies the
    /// concatenation of `pieces` into this rank's slot of the round, and once the copy
    /// completed tells every peer; returns once every peer told this rank of its block of the
    /// round. Waits as wait() does (moving messages, bounded by the timeout, failing with the
    /// group), as for a receive of `tag` from the first rank not heard from.
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag) {
        throw_if_failed();
        check_device();
        std::size_t bytes = 0;
        for (auto const& piece : pieces) bytes += piece.size();
        if (bytes > direct_bytes_)
            throw invalid_argument("staged transport: a direct block of " + std::to_string(bytes) + " bytes exceeds direct_bytes " +
                                   std::to_string(direct_bytes_));
        std::uint64_t const round = ++round_;
        failing_on_error([&] {
            std::byte* to = direct_slot(static_cast<std::byte*>(fifo_), round);
            for (auto const& piece : pieces) {
                if (!piece.empty()) device_.copy(to, piece.data(), piece.size());
                to += piece.size();
            }
        });
        publish({round, bytes, agreed, tag, direct_record::in_slot, nullptr}, {});
    }

    /// Whether the device exports a caller's memory to the peers (expose()).
    static constexpr bool can_expose = requires(Device& d, void const* p, std::size_t n) { d.export_range(p, n); };

    /// A round of the direct exchange whose block is `buffer` itself, where it lies
    /// (transport/concepts.hpp, exposing_transport): once this rank's work before it completed,
    /// every peer gets the buffer's handle; returns, as exchange() does, once every peer's
    /// record of the round came, and with it whether every rank's buffer could be exported
    /// (false: some rank's memory cannot be, every rank's blocks of the round are then empty
    /// and every rank returns false).
    bool expose(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag)
        requires can_expose
    {
        return expose_round(buffer, {}, agreed, tag, 0);
    }

    /// expose() where each peer reads a part of `buffer` only: `parts[r]`, a subrange of it, is
    /// rank r's block of this rank (its record carries that part's offset and size, so a rank
    /// learns the size of every peer's block for it; a peer whose part is empty opens nothing).
    bool expose(std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts, std::uint64_t agreed,
                tag_t tag)
        requires can_expose
    {
        if (std::string what = exposed_parts_error("staged transport", static_cast<std::size_t>(size()), buffer, parts); !what.empty())
            throw invalid_argument(what);
        return expose_round(buffer, parts, agreed, tag, 0);
    }

    /// A round of expose() that also registers `buffer` (registering_transport): every peer
    /// keeps this rank's allocation open until release_registration, and the exposures of any
    /// range inside it carry the registration instead of a new export, so that later
    /// collectives on it neither query nor open anything. Returns the registration's number,
    /// the same on every rank, or 0 (on every rank) where some rank's buffer could not be
    /// exported: then nothing is kept.
    std::uint64_t keep(std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag)
        requires can_expose
    {
        std::uint64_t const id = ++registrations_;  // every rank counts every call alike
        return expose_round(buffer, {}, agreed, tag, id) ? id : 0;
    }

    /// Ends registration `id` (0: none, a no-op on every rank): this rank closes the peers'
    /// allocations it kept for it, once its reads of them completed, and returns after a round
    /// in which every peer did the same, so that each rank may free its buffer then.
    void release_registration(std::uint64_t id, std::uint64_t agreed, tag_t tag)
        requires can_expose
    {
        throw_if_failed();
        check_device();  // the synchronisation below must wait on this transport's device
        std::erase_if(registered_, [&](own_registration const& k) { return k.id == id; });
        failing_on_error([&] { device_.synchronize(); });  // every read of the kept memory enqueued so far
        for (auto& q : peers_)
            std::erase_if(q.kept, [&](opened_exposure const& k) {
                if (k.registration != id) return false;
                device_.close_handle(k.base);
                return true;
            });
        exchange({}, agreed, tag);
    }

    /// Rank r's block of this rank's latest round, in r's memory (this rank's own: its slot, or
    /// the buffer it exposed).
    std::span<std::byte const> block(rank_t r) const noexcept {
        peer_state const& q = peers_[static_cast<std::size_t>(r)];
        direct_record const& d = q.direct[round_ & 1];
        if (d.kind == direct_record::in_place) {  // not opened (a round that falls back): empty
            if (d.data == nullptr) return {};
            return {d.data, static_cast<std::size_t>(d.bytes)};
        }
        if (d.kind == direct_record::unexported) return {};
        auto const* base = static_cast<std::byte const*>(r == me_ ? fifo_ : q.opened);
        return {direct_slot(base, round_), static_cast<std::size_t>(d.bytes)};
    }
    std::uint64_t agreed(rank_t r) const noexcept { return peers_[static_cast<std::size_t>(r)].direct[round_ & 1].agreed; }

    op_ptr isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        check_peer(me_, peer, size());
        throw_if_failed();
        check_device();
        auto op = make_op<staged_op>(true, peer, tag, bytes.size());
        op->out = bytes.data();
        peer_of(peer).sends.push_back(op);
        failing_on_error([&] { progress_sends(peer); });
        return op;
    }

    op_ptr irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        check_peer(me_, peer, size());
        throw_if_failed();
        check_device();
        auto op = make_op<staged_op>(false, peer, tag, bytes.size());
        op->in = bytes.data();
        peer_state& q = peer_of(peer);
        // Messages that arrived first are older than any still to come: they match first.
        auto& queue = q.queue;
        auto const it = queue.find_message(*op, me_, [](unexpected_ptr const& u) { return u->receiver != nullptr; });
        if (op->done) return op;  // a message of another collective failed it
        if (it == queue.messages().end()) {
            queue.post(op);
            return op;
        }
        // The message is op's even when its size is wrong: it is then dropped once it arrived.
        check_size(*op, me_, (*it)->total);
        (*it)->receiver = op;
        failing_on_error([&] { drain_unexpected(q); });
        return op;
    }

    void wait(op_ptr const& op) {
        check_device();
        wait_until(
            *op, deadline_after(timeout_), [&] { return op->done && !op->failed(); },
            [&] {
                if (exchanges_instead(*op)) op->fail(errc::size_mismatch, direct_mismatch_message(me_, op->tag, op->peer, false));
            },
            [&] { unpost(*op); });
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
        raise_signals(/*everyone=*/true);  // after the reason left: a peer stopped by the word finds it there
    }

private:
    using clock = std::chrono::steady_clock;
    using control_request = typename Control::request;
    static constexpr tag_t control_tag = 1, handle_tag = 2, exposure_tag = 3;

    // What a rank sends each peer at set-up: the handle of its memory and where in it things lie.
    struct hello {
        typename Device::handle handle;
        std::uint64_t chunk, slots, direct_bytes;
        std::uint64_t signals;  // 1: it asked for signaled launches (and has the pad)
    };
    static_assert(std::is_trivially_copyable_v<hello>);
    // A peer's direct record of one round (its latest two are kept: a peer may announce round
    // k + 1 while this rank still waits for another's record of round k).
    // Where a caller's buffer lies for the peers: the handle of the allocation holding it and
    // its offset there (Device::export_range).
    struct exposed_at {
        typename Device::handle handle;
        std::uint64_t offset;
    };
    // What one peer reads of an exposed buffer: from `offset`, `bytes` of it.
    struct exposed_part {
        std::uint64_t offset, bytes;
    };
    struct direct_record {
        enum kind_t : int { in_slot, in_place, unexported };
        std::uint64_t round = 0, bytes = 0, agreed = 0;
        tag_t tag = 0;
        kind_t kind = in_slot;
        std::byte const* data = nullptr;  // in_place: the block, mapped into this process once opened
        exposed_at at{};                  // in_place, a peer's: where it lies
        std::uint64_t registration = 0;   // in_place: the registration it lies in (keep()), 0: none
    };
    // What an exposing rank sends each peer (control tag 3): the round's record, and where its
    // buffer lies unless it could not be exported.
    struct exposure_message {
        staged_control record;  // kind direct: tag, total = bytes, offset = round, slot = agreed
        std::uint64_t exported;  // 0: not (the block is empty on every rank)
        exposed_at at;
        std::uint64_t registration;  // the sender's registration the buffer lies in, 0: none
    };
    static_assert(std::is_trivially_copyable_v<exposure_message>);
    // A peer's allocation this rank opened for an exposure, kept for the collective's later
    // rounds (two_shot exposes the same vector twice), or for a registration (registration != 0)
    // until it is released.
    struct opened_exposure {
        typename Device::handle handle;
        void* base;
        std::uint64_t registration = 0;
    };
    // A buffer this rank registered (keep()): where it lies for the peers.
    struct own_registration {
        std::uint64_t id;
        std::span<std::byte const> range;
        exposed_at at;
    };
    // This rank's latest export, reused by the next round for the same buffer.
    struct own_export {
        std::uint64_t round;
        tag_t tag;
        std::span<std::byte const> buffer;
        exposed_at at;
    };

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
        void* opened = nullptr;  // a rendezvous received: the sender's allocation, closed once copied
    };
    // A rendezvous message's number and where its bytes lie, as its record said (the sender's
    // registration holding them, or 0).
    struct rendezvous_record {
        std::uint64_t number;
        exposed_at at;
        std::uint64_t registration;
    };
    // A control message in flight: it stays (its bytes at a stable address) until sent.
    template <class Message>
    struct pending_send {
        std::unique_ptr<Message> message;
        std::optional<control_request> request;
    };
    struct peer_state {
        // towards the peer
        std::byte* remote = nullptr;  // our region of the peer's FIFO
        void* opened = nullptr;       // the peer's FIFO as open_handle returned it (not for self)
        std::size_t credits = 0, next_slot = 0;
        std::deque<op_ptr> sends;             // posted, not all chunks enqueued
        std::deque<chunk_copy> send_copies;   // enqueued, header not sent yet
        std::deque<pending_send<staged_control>> control_sends;
        std::deque<pending_send<exposure_message>> exposure_sends;
        std::deque<exposure_message> rendezvous_out;  // the records of the rendezvous in send_copies
        std::deque<std::pair<std::uint64_t, op_ptr>> delivering;  // rendezvous sent, not delivered yet
        std::uint64_t rendezvous_sent = 0;
        // from the peer
        staged_control in{};
        std::optional<control_request> control_in;
        std::optional<control_request> handle_in, handle_out;  // set-up, see exchange_handles
        bool said_bye = false;
        match_queue<staged_op, unexpected_ptr> queue;  // posted receives, unexpected messages
        op_ptr current;                                // the receive the arriving message goes to, or
        unexpected_ptr current_staged;                 // the unexpected message it goes to
        std::deque<chunk_copy> recv_copies;
        std::uint64_t credits_owed = 0;
        std::array<direct_record, 2> direct{};  // by round % 2
        exposure_message exposure_in_message{};
        std::optional<control_request> exposure_in;
        std::vector<opened_exposure> exposures;  // the peer's allocations open here for a collective
        std::vector<opened_exposure> kept;       // and for its registrations
        std::deque<rendezvous_record> rendezvous_in;  // records whose header is still to come
    };

    std::size_t region_bytes() const noexcept { return chunk_ * slots_; }
    // The direct slots: behind the FIFOs, each at a multiple of 256 bytes (blocks must be
    // aligned to direct_alignment; device allocations are aligned to 256).
    static constexpr std::size_t round_up(std::size_t n) noexcept { return (n + 255) / 256 * 256; }
    std::size_t direct_offset() const noexcept { return round_up(peers_.size() * region_bytes()); }
    std::size_t direct_stride() const noexcept { return round_up(direct_bytes_); }
    // The signal pad and its two slots (signals.hpp): behind the direct slots.
    std::size_t signal_offset() const noexcept { return direct_offset() + 2 * direct_stride(); }
    static constexpr std::size_t pad_stride() noexcept { return round_up(sizeof(signal_pad)); }
    template <class Byte>
    Byte* direct_slot(Byte* base, std::uint64_t round) const noexcept {
        return base + direct_offset() + (round & 1) * direct_stride();
    }
    peer_state& peer_of(rank_t r) noexcept { return peers_[static_cast<std::size_t>(r)]; }

    // expose() and keep(): `parts` what each rank reads of `buffer` (empty: all of it),
    // `keeping` the registration being made (0: none).
    bool expose_round(std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts, std::uint64_t agreed,
                      tag_t tag, std::uint64_t keeping) {
        throw_if_failed();
        check_device();
        std::uint64_t const round = ++round_;
        auto const part = [&](rank_t r) { return parts.empty() ? buffer : parts[static_cast<std::size_t>(r)]; };
        // A buffer no peer reads needs no export (an alltoallv's rank that sends only to itself).
        bool read = keeping != 0;
        for (rank_t r = 0; r < size() && !read; ++r) read = r != me_ && !part(r).empty();
        std::optional<exposed_at> exported;
        std::uint64_t registration = keeping;
        if (own_registration const* k = keeping == 0 ? registration_of(buffer) : nullptr) {
            // Inside a registered buffer: its export, kept open by every peer.
            exported = place_in(*k, buffer);
            registration = k->id;
        } else if (keeping == 0 && last_export_ && last_export_->round + 1 == round && last_export_->tag == tag &&
                   last_export_->buffer.data() == buffer.data() && last_export_->buffer.size() == buffer.size()) {
            // The buffer the round before exposed in this collective (two_shot's second round):
            // its export again, not a second query that could answer otherwise. Of another
            // collective (the round before fell back, or kept nothing) it may be another
            // allocation at the same address: queried again.
            exported = last_export_->at;
        } else if (read && !buffer.empty()) {
            failing_on_error([&] { exported = export_of(buffer); });
        }
        if (exported && keeping == 0) last_export_ = {round, tag, buffer, *exported};
        bool const ok = !read || buffer.empty() || exported.has_value();
        publish({round, part(me_).size(), agreed, tag, ok ? direct_record::in_place : direct_record::unexported, part(me_).data(), {},
                 ok ? registration : 0},
                exported, [&](rank_t r) {
                    auto const mine = part(r);  // an empty part may point anywhere
                    return exposed_part{mine.empty() ? 0 : static_cast<std::uint64_t>(mine.data() - buffer.data()), mine.size()};
                });
        if (!std::ranges::all_of(peers_, [&](peer_state const& q) { return q.direct[round & 1].kind != direct_record::unexported; }))
            return false;
        // Every rank's buffer can be read: the peers' allocations are opened now, not as their
        // records arrive, so that a round whose blocks are not read maps nothing.
        failing_on_error([&] {
            for (rank_t r = 0; r < size(); ++r) {
                direct_record& d = peer_of(r).direct[round & 1];
                if (r == me_ || d.bytes == 0) continue;
                void* const base = d.registration != 0 ? kept_exposure(r, d.registration, d.at.handle) : open_exposure(r, d.at.handle);
                d.data = static_cast<std::byte const*>(base) + d.at.offset;
            }
        });
        if (keeping != 0 && !buffer.empty()) registered_.push_back({keeping, buffer, *exported});
        return true;
    }

    // This rank's registration holding all of `buffer` (none for an empty one).
    own_registration const* registration_of(std::span<std::byte const> buffer) const noexcept {
        if (buffer.empty()) return nullptr;
        for (auto const& k : registered_) {
            auto const* first = k.range.data();
            if (std::less_equal<>{}(first, buffer.data()) && std::less_equal<>{}(buffer.data() + buffer.size(), first + k.range.size()))
                return &k;
        }
        return nullptr;
    }
    // Where `buffer`, inside registration `k`, lies for the peers.
    static exposed_at place_in(own_registration const& k, std::span<std::byte const> buffer) noexcept {
        return {k.at.handle, k.at.offset + static_cast<std::uint64_t>(buffer.data() - k.range.data())};
    }
    // Where `buffer` lies for the peers once exported; std::nullopt for memory the device cannot share.
    std::optional<exposed_at> export_of(std::span<std::byte const> buffer) {
        if (auto const x = device_.export_range(buffer.data(), buffer.size())) return exposed_at{x->handle, x->offset};
        return std::nullopt;
    }

    // Runs f; a device or control error in it fails the engine (and goes on to the caller).
    template <class F>
    void failing_on_error(F const& f) {
        try {
            f();
        } catch (error const&) {
            fail_engine();
            throw;
        }
    }

    void throw_if_failed() const {
        if (failure_) std::rethrow_exception(failure_);
    }

    // Before a wait throws: copies already queued on the device into the caller's buffers (or
    // the scratch of the collective it fails) finish now, while those buffers still exist —
    // the exception frees the scratch as it unwinds. A device in error may fail this too.
    void settle_device() noexcept {
        try {
            device_.synchronize();
        } catch (...) {
        }
    }

    // Posts the exchange of FIFO handles; progress() opens each peer's when it arrived. Not waited
    // for: a peer that fails right after its set-up must fail our next operation, not this one.
    void exchange_handles() {
        own_hello_ = {device_.export_handle(fifo_), chunk_, slots_, direct_bytes_, signals_ ? 1u : 0u};
        handles_.resize(peers_.size());
        for (rank_t r = 0; r < size(); ++r) {
            peer_state& q = peer_of(r);
            q.credits = slots_;
            if (r == me_) {
                q.remote = static_cast<std::byte*>(fifo_) + static_cast<std::size_t>(me_) * region_bytes();
                continue;
            }
            q.handle_in.emplace(control_->irecv(r, handle_tag, std::as_writable_bytes(std::span(&handles_[static_cast<std::size_t>(r)], 1))));
            q.handle_out.emplace(control_->isend(r, handle_tag, std::as_bytes(std::span(&own_hello_, 1))));
        }
    }

    void open_peer(rank_t r) {
        peer_state& q = peer_of(r);
        if (q.handle_out && q.handle_out->test()) q.handle_out.reset();
        if (closing_ || q.remote || !q.handle_in || !q.handle_in->test()) return;
        q.handle_in.reset();
        hello const& theirs = handles_[static_cast<std::size_t>(r)];
        if (theirs.chunk != chunk_ || theirs.slots != slots_ || theirs.direct_bytes != direct_bytes_) {
            auto const layout = [](hello const& h) {
                return "chunk " + std::to_string(h.chunk) + ", slots " + std::to_string(h.slots) + ", direct_bytes " +
                       std::to_string(h.direct_bytes);
            };
            std::string const what = "staged transport: rank " + std::to_string(r) + " has " + layout(theirs) + ", rank " +
                                     std::to_string(me_) + " " + layout(own_hello_) +
                                     " (every rank must agree: CHORUS_CUDA_CHUNK_BYTES, CHORUS_CUDA_SLOTS, CHORUS_CUDA_DIRECT_BYTES)";
            abort(what);
            throw invalid_argument(what);
        }
        q.opened = device_.open_handle(theirs.handle);
        q.remote = static_cast<std::byte*>(q.opened) + static_cast<std::size_t>(me_) * region_bytes();
    }

    void close_peers() noexcept {
        for (auto& q : peers_) {
            if (q.opened) device_.close_handle(std::exchange(q.opened, nullptr));
            close_all(q.kept);  // the registrations never released
        }
        close_exposures();  // those of a collective that failed between its rounds
    }

    // The events and staging buffers still held for this peer (at destruction).
    void release_device_state(peer_state& q) noexcept {
        for (auto& c : q.send_copies) device_.release(c.event);
        for (auto& c : q.recv_copies) {
            device_.release(c.event);
            if (c.opened) device_.close_handle(c.opened);
        }
        for (auto& u : q.queue.messages()) {
            if (u->drain) device_.release(*u->drain);
            if (u->buffer) device_.release(u->buffer);
        }
        q.send_copies.clear();
        q.recv_copies.clear();
        q.queue.messages().clear();
        q.current_staged.reset();
    }

    // True once every peer said goodbye (its copies into our FIFO are complete, it closed it).
    bool goodbye() {
        for (rank_t r = 0; r < size(); ++r) send_control(r, {staged_control::bye, 0, 0, 0, 0, 0});
        auto const deadline = deadline_after(timeout_);
        auto const finished = [&] {
            return std::ranges::all_of(peers_, [](peer_state const& q) {
                return q.said_bye && q.control_sends.empty() && q.exposure_sends.empty();
            });
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

    // Copies and events must go to the device the FIFOs live on: a thread whose current device
    // is another one fails here, and the group with it, rather than misplacing work. A signaled
    // launch may be captured into a CUDA graph (`capturing`); other work may not. A signaled
    // launch that failed on the device since the last call fails the group here.
    void check_device(bool capturing = false) {
        try {
            if constexpr (can_signal) device_.check_current(capturing);
            else device_.check_current();
        } catch (error const& e) {
            abort(e.what());
            settle_device();
            throw;
        }
        check_signals();
    }

    // The pad starts zeroed (flags count launches from 1), before any peer can open it.
    void zero_pad() {
        std::vector<std::byte> const zeros(sizeof(signal_pad));
        device_.copy(static_cast<std::byte*>(fifo_) + signal_offset(), zeros.data(), zeros.size());
        device_.synchronize();
    }

    // Until every peer's set-up message came (and its memory is open here), as a receive waits.
    void await_peers() {
        if (peers_heard_) return;
        auto const missing = [&]() -> rank_t {
            for (rank_t r = 0; r < size(); ++r)
                if (!peer_of(r).remote) return r;
            return -1;
        };
        message_op op;
        wait_until(op, deadline_after(timeout_), [&] { return missing() < 0; }, [&] { op.peer = missing(); }, [] {});
        peers_heard_ = true;
        all_signal_ = std::ranges::all_of(handles_, [&](hello const& h) { return &h == &handles_[static_cast<std::size_t>(me_)] || h.signals; });
    }

    // A signaled launch's failure, once the device published it: the group fails (failure_),
    // naming the rank to blame as every rank's device does. True if it did.
    bool signals_failed() {
        if constexpr (can_signal) {
            if (!launched_ || failure_) return false;
            signal_status const s = read_signal_status(device_.failure_status());
            if (s.code == 0) return false;
            auto const shape = [&](std::uint64_t w) { return describe_ ? describe_(w) : std::string("a signaled collective"); };
            std::string const me = "rank " + std::to_string(me_) + ": ", culprit = "rank " + std::to_string(s.culprit);
            std::string const found = s.finder == me_ ? std::string()
                                                      : " (rank " + std::to_string(s.finder) + " found it on the device and stopped every rank)";
            std::string what;
            switch (static_cast<signal_failure>(s.code)) {
            case signal_failure::timeout:
                what = me + culprit + " did not reach " + shape(s.shape) + " on the device within the timeout (" +
                       std::to_string(timeout_.count()) + " ms): it died, hangs, or called another collective" + found;
                failure_ = std::make_exception_ptr(timeout_error(s.culprit, what));
                break;
            case signal_failure::mismatch:  // with both shapes where this rank found it, else as relayed
                what = s.finder == me_ ? me + culprit + " called " + shape(s.theirs) + ", rank 0 " + shape(s.first) +
                                             " (on the device): the ranks called it differently"
                                       : me + culprit + " called " + shape(s.shape) + " differently from rank 0, as rank " +
                                             std::to_string(s.finder) + " found on the device (it stopped every rank)";
                failure_ = std::make_exception_ptr(transport_error(errc::size_mismatch, s.culprit, what));
                break;
            default: {  // its host failed the group: the control channel brings its reason (sent first)
                auto const deadline = clock::now() + std::chrono::seconds(2);
                while (!failure_ && clock::now() < deadline) {
                    progress();
                    std::this_thread::yield();
                }
                if (failure_) return true;
                what = me + culprit + " failed the group while this rank's device waited for it in " + shape(s.shape);
                failure_ = std::make_exception_ptr(transport_error(errc::peer_failed, s.culprit, what));
                break;
            }
            }
            try {
                control_->abort(what.c_str());  // not abort(): the devices were stopped already, by their own word
            } catch (...) {
            }
            for (auto& q : peers_) q.queue.drop_receives();
            settle_device();
            return true;
        }
        return false;
    }
    void check_signals() {
        if (signals_failed()) std::rethrow_exception(failure_);
    }

    // A failure on the host stops this rank's signaled launches at once, and the peers' where it
    // is this rank's own (`everyone`; a failure the control channel brought reached them too):
    // the abort word, written into each pad (the peers' through the mappings this rank holds)
    // beside the queued work.
    void raise_signals(bool everyone) noexcept {
        if constexpr (can_signal) {
            if (!signals_ || raised_) return;
            raised_ = true;
            std::uint64_t const word = signal_abort_word(signal_failure::host, 0, me_, me_);
            for (rank_t r = 0; r < size(); ++r) {
                void* const base = r == me_ ? fifo_ : peer_of(r).opened;
                if (base && (r == me_ || (everyone && all_signal_)))  // a rank that did not ask for signals has no pad
                    device_.raise(reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(base) + signal_offset() + offsetof(signal_pad, abort)),
                                  word);
            }
        }
    }

    bool device_capturing() {
        if constexpr (requires { device_.capturing(); }) return device_.capturing();
        else return false;
    }

    void unpost(staged_op& op) noexcept { peer_of(op.peer).queue.unpost(op); }

    // One pass over every peer. A failed control operation (a peer died, aborted, or timed
    // out) fails the engine: every wait rethrows it.
    void progress() {
        if (failure_) return;
        try {
            for (rank_t r = 0; r < size(); ++r) {
                peer_state& q = peer_of(r);
                open_peer(r);
                auto const exposures = [&] {
                    while (read_exposure(r)) {
                    }
                };
                while (!q.said_bye && q.control_in->test()) {
                    on_control(r, q.in);
                    // An exposure record the peer sent before its goodbye (its last round a
                    // registration, or an exposure whose collective fell back to messages with
                    // other ranks) came first on the channel: read before the goodbye ends it.
                    if (q.said_bye) exposures();
                    else post_control_receive(r);
                }
                if (!q.said_bye) exposures();
                progress_sends(r);
                progress_receives(r);
                std::erase_if(q.control_sends, [](auto& c) { return c.request->test(); });
                std::erase_if(q.exposure_sends, [](auto& c) { return c.request->test(); });
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
        bool own = false;  // this rank's failure (its device's), not one the control channel brought
        try {
            throw;
        } catch (device_error const& e) {
            control_->abort(e.what());
            own = true;
        } catch (...) {
        }
        raise_signals(own);
        for (auto& q : peers_) q.queue.drop_receives();
        settle_device();
    }

    void send_control(rank_t to, staged_control const& m) { send_on(to, control_tag, m, peer_of(to).control_sends); }

    // Sends `m` on control tag `channel`; kept in `pending` until the channel took it.
    template <class Message>
    void send_on(rank_t to, tag_t channel, Message const& m, std::deque<pending_send<Message>>& pending) {
        pending_send<Message> c{std::make_unique<Message>(m), std::nullopt};
        c.request.emplace(control_->isend(to, channel, std::as_bytes(std::span(c.message.get(), 1))));
        if (!c.request->test()) pending.push_back(std::move(c));
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
            if (!std::exchange(op.routed, true) && start_rendezvous(r, q.sends.front())) {
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
            // Off the queue before anything that may throw: no event is released twice.
            chunk_copy c = std::move(q.send_copies.front());
            q.send_copies.pop_front();
            device_.release(c.event);
            if (c.header.kind == staged_control::rendezvous) {  // its record first: the peer has it with the header
                exposure_message const record = q.rendezvous_out.front();
                q.rendezvous_out.pop_front();
                q.delivering.emplace_back(c.header.slot, c.op);
                send_exposure(r, record);
                send_control(r, c.header);
                continue;
            }
            send_control(r, c.header);
            c.op->completed += static_cast<std::size_t>(c.header.length);
            if (c.op->completed == c.op->size) c.op->done = true;
        }
    }

    // A message to another rank, of rendezvous_bytes or more, whose memory the device exports
    // (or that lies in a registration): queued as a rendezvous (protocol.hpp), its header to
    // leave once this rank's work before it completed, in the place of a first chunk.
    bool start_rendezvous(rank_t r, op_ptr const& op) {
        if constexpr (can_expose) {
            if (rendezvous_bytes_ == 0 || r == me_ || op->size < rendezvous_bytes_) return false;
            peer_state& q = peer_of(r);
            std::span<std::byte const> const buffer(op->out, op->size);
            exposure_message m{{staged_control::rendezvous, op->tag, op->size, 0, op->size, q.rendezvous_sent}, 1, {}, 0};
            if (own_registration const* k = registration_of(buffer)) {
                m.at = place_in(*k, buffer);
                m.registration = k->id;
            } else if (auto const x = export_of(buffer)) {
                m.at = *x;
            } else {
                return false;  // memory the device cannot share: through the FIFO
            }
            q.send_copies.push_back({device_.record(), m.record, op, {}});  // first: record() may throw
            q.rendezvous_out.push_back(m);
            ++q.rendezvous_sent;
            op->enqueued = op->size;
            return true;
        } else {
            return false;
        }
    }

    void on_control(rank_t from, staged_control const& m) {
        peer_state& q = peer_of(from);
        if (m.kind == staged_control::bye) return void(q.said_bye = true);
        if (m.kind == staged_control::rendezvous) return on_rendezvous(from, m);
        if (m.kind == staged_control::delivered) {
            if (q.delivering.empty() || q.delivering.front().first != m.slot) corrupt_record(from, "delivered");
            staged_op& op = *q.delivering.front().second;
            op.completed = op.size;
            op.done = true;
            q.delivering.pop_front();
            return;
        }
        if (m.kind == staged_control::direct) {
            // Its block fits our slots (the layouts agreed at set-up).
            check_round(from, m.offset);
            q.direct[m.offset & 1] = {m.offset, std::min<std::uint64_t>(m.total, direct_bytes_), m.slot, static_cast<tag_t>(m.tag),
                                      direct_record::in_slot, nullptr};
            return;
        }
        if (m.kind == staged_control::credit) return void(q.credits += static_cast<std::size_t>(m.length));
        if (m.offset == 0) start_message(from, m);
        if (m.length == 0) {  // a zero-length message: nothing to copy
            if (q.current && !q.current->done) q.current->done = true;
            return;
        }
        std::byte* const dst = destination(q, m.offset);
        // A receive that failed (size mismatch) still frees the message's slots, in order.
        if (dst) device_.copy(dst, local_slot(from, static_cast<std::size_t>(m.slot)), static_cast<std::size_t>(m.length));
        q.recv_copies.push_back({device_.record(), m, q.current, q.current_staged});
    }

    // A rendezvous header: the message is matched as a first chunk and copied at once from where
    // it lies, into its receive buffer or staging (none for a receive of another size); its
    // record came before it on the channel. Once copied, the sender hears it was delivered.
    void on_rendezvous(rank_t from, staged_control const& m) {
        if constexpr (can_expose) {
            peer_state& q = peer_of(from);
            while (q.rendezvous_in.empty() && read_exposure(from)) {
            }
            if (q.rendezvous_in.empty() || q.rendezvous_in.front().number != m.slot) corrupt_record(from, "rendezvous");
            rendezvous_record const at = q.rendezvous_in.front();
            q.rendezvous_in.pop_front();
            start_message(from, m);
            std::byte* const dst = destination(q, 0);
            // A registration this rank still keeps needs no open; one it released already (the
            // sender's message left before the release reached it), or not yet opened (its keep
            // round still waits for a third rank), is opened for this copy only — a second open
            // of an allocation the process has open is counted by CUDA and returns the same
            // mapping, and each close undoes one.
            void const* base = at.registration != 0 ? kept_base(from, at.registration) : nullptr;
            void* opened = nullptr;
            try {
                if (dst) {
                    if (!base) base = opened = device_.open_handle(at.at.handle);
                    device_.copy(dst, static_cast<std::byte const*>(base) + at.at.offset, static_cast<std::size_t>(m.total));
                }
                q.recv_copies.push_back({device_.record(), m, q.current, q.current_staged, opened});
            } catch (...) {  // the engine fails: nothing stays open that no entry closes
                if (opened) {
                    device_.synchronize();
                    device_.close_handle(opened);
                }
                throw;
            }
        } else {
            corrupt_record(from, "rendezvous");  // a device that exports nothing has no peer that sends one
        }
    }

    // A control word out of order: the peer's state is not this rank's, so the group fails.
    [[noreturn]] void corrupt_record(rank_t from, char const* kind) {
        std::string const what = "staged transport: rank " + std::to_string(from) + " sent rank " + std::to_string(me_) + " a " + kind +
                                 " word out of order (a corrupt control record)";
        abort(what);
        throw transport_error(errc::peer_failed, from, what);
    }

    // Where the arriving message's bytes from `offset` go: its staging, or its receive unless that
    // failed (another size: nowhere).
    static std::byte* destination(peer_state const& q, std::uint64_t offset) noexcept {
        if (q.current_staged) return static_cast<std::byte*>(q.current_staged->buffer) + offset;
        if (q.current && !q.current->done) return q.current->in + offset;
        return nullptr;
    }

    // The first chunk of a message: to the oldest receive posted for it (one of another size
    // fails, and the message's chunks only free their slots), else staged as unexpected.
    void start_message(rank_t from, staged_control const& m) {
        peer_state& q = peer_of(from);
        q.current = q.queue.take_receive(me_, from, m.tag);
        q.current_staged.reset();
        if (q.current) {
            check_size(*q.current, me_, static_cast<std::size_t>(m.total));
            return;
        }
        auto u = std::make_shared<unexpected_message>();
        u->tag = m.tag;
        u->total = static_cast<std::size_t>(m.total);
        if (u->total) u->buffer = device_.allocate(u->total);
        q.queue.messages().push_back(u);
        q.current_staged = std::move(u);
    }

    void progress_receives(rank_t r) {
        peer_state& q = peer_of(r);
        while (!q.recv_copies.empty() && device_.done(q.recv_copies.front().event)) {
            // Off the queue before anything that may throw: nothing is released or closed twice.
            chunk_copy c = std::move(q.recv_copies.front());
            q.recv_copies.pop_front();
            device_.release(c.event);
            if (c.header.kind == staged_control::rendezvous) {  // read: the sender may reuse its buffer
                if (c.opened) device_.close_handle(c.opened);
                send_control(r, {staged_control::delivered, c.header.tag, c.header.total, 0, 0, c.header.slot});
            } else {
                ++q.credits_owed;
            }
            auto const len = static_cast<std::size_t>(c.header.length);
            if (c.staged) {
                c.staged->arrived += len;
            } else if (c.op && !c.op->done) {
                c.op->completed += len;
                if (c.op->completed == c.op->size) c.op->done = true;
            }
        }
        if (q.credits_owed)
            send_control(r, {staged_control::credit, 0, 0, 0, std::exchange(q.credits_owed, 0), 0});
        drain_unexpected(q);
    }

    // Copies the unexpected messages that were matched and arrived whole into their receive
    // buffers, and frees them once delivered (or, for a receive of another size, once they
    // arrived: their chunks are copied into the staging buffer until then).
    void drain_unexpected(peer_state& q) {
        for (auto& u : q.queue.messages()) {
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
        std::erase_if(q.queue.messages(), [&](unexpected_ptr const& u) {
            if (!u->receiver || !u->receiver->done || u->drain || u->arrived != u->total) return false;
            if (u->buffer) device_.release(u->buffer);
            u->buffer = nullptr;
            return true;
        });
    }

    // The rest of a direct round, once this rank's block is in place (copied into its slot, or
    // the caller's buffer): waits until the device completed the copy and every earlier read
    // of peers' blocks this rank enqueued, then sends each peer the record (with the buffer's
    // handle, exposed) and waits for every peer's of the same round. The peers may then reuse
    // their slots of the round before: this rank read them before. One deadline for the round.
    // `part_for(r)`: where rank r's part lies in the exposed buffer (exposures only).
    template <class PartFor = std::nullptr_t>
    void publish(direct_record own, std::optional<exposed_at> const& exported, PartFor const& part_for = nullptr) {
        std::uint64_t const round = own.round;
        tag_t const tag = own.tag;
        std::optional<typename Device::event> completed;
        failing_on_error([&] { completed.emplace(device_.record()); });
        auto const deadline = deadline_after(timeout_);
        bool done = false;
        try {
            wait_direct([&] { return done || (done = device_.done(*completed)); }, tag, [&] { return me_; }, deadline);
        } catch (...) {
            device_.release(*completed);
            throw;
        }
        device_.release(*completed);
        if (own.kind == direct_record::in_slot) close_exposures();  // read, every one (the wait above)
        peer_of(me_).direct[round & 1] = own;
        staged_control const record{staged_control::direct, tag, own.bytes, round, 0, own.agreed};
        failing_on_error([&] {
            for (rank_t r = 0; r < size(); ++r) {
                if (r == me_) continue;
                if constexpr (std::is_null_pointer_v<PartFor>) {
                    send_control(r, record);
                } else {
                    exposure_message m{record, own.kind == direct_record::in_place ? 1u : 0u, exported.value_or(exposed_at{}),
                                       own.registration};
                    exposed_part const theirs = part_for(r);
                    m.record.total = theirs.bytes;  // the peer's block: its part, where it lies
                    m.at.offset += theirs.offset;
                    send_exposure(r, m);
                }
            }
        });
        auto const missing = [&]() -> rank_t {  // the first rank not heard from (or not opened)
            for (rank_t r = 0; r < size(); ++r) {
                peer_state const& q = peer_of(r);
                if (q.direct[round & 1].round != round || !q.remote) return r;
            }
            return -1;
        };
        wait_direct([&] { return missing() < 0; }, tag, missing, deadline);
        for (rank_t r = 0; r < size(); ++r) {
            direct_record const& theirs = peer_of(r).direct[round & 1];
            // The same round of another collective: a rank skipped one, or called others.
            if (theirs.tag != tag) {
                std::string const what = collective_mismatch_message(me_, tag, r, theirs.tag);
                abort(what);
                throw transport_error(errc::tag_mismatch, r, what);
            }
            // A block in a slot against a buffer in place, for the same shape: the ranks run
            // different algorithms of one collective (CHORUS_ALGO differs between them). Of
            // different shapes (sizes), the collective's own check names them, before any read.
            if ((theirs.kind == direct_record::in_slot) != (own.kind == direct_record::in_slot) && theirs.agreed == own.agreed) {
                auto const how = [](direct_record const& d) { return d.kind == direct_record::in_slot ? "in its slot" : "in place"; };
                std::string const what = "rank " + std::to_string(me_) + ": rank " + std::to_string(r) + " published its block " +
                                         how(theirs) + ", rank " + std::to_string(me_) + " " + how(own) + " (" + describe_tag(tag) +
                                         "): the ranks run different algorithms of it (CHORUS_ALGO must agree)";
                abort(what);
                throw transport_error(errc::tag_mismatch, r, what);
            }
        }
    }

    void send_exposure(rank_t to, exposure_message const& m) { send_on(to, exposure_tag, m, peer_of(to).exposure_sends); }

    void post_exposure_receive(rank_t r) {
        peer_state& q = peer_of(r);
        q.exposure_in.emplace(control_->irecv(r, exposure_tag, std::as_writable_bytes(std::span(&q.exposure_in_message, 1))));
    }

    // Reads the peer's next exposure record, if it came.
    bool read_exposure(rank_t r) {
        peer_state& q = peer_of(r);
        if (!q.exposure_in || !q.exposure_in->test()) return false;
        on_exposure(r, q.exposure_in_message);
        post_exposure_receive(r);
        return true;
    }

    // A peer's exposure record: where its buffer lies (opened by expose() once every rank's
    // record came and every buffer can be read), or where a rendezvous message does.
    void on_exposure(rank_t from, exposure_message const& m) {
        if (m.record.kind == staged_control::rendezvous) {
            peer_of(from).rendezvous_in.push_back({m.record.slot, m.at, m.registration});
            return;
        }
        check_round(from, m.record.offset);
        std::uint64_t const round = m.record.offset;
        peer_of(from).direct[round & 1] = {round,   m.record.total, m.record.slot, static_cast<tag_t>(m.record.tag),
                                           m.exported ? direct_record::in_place : direct_record::unexported,
                                           nullptr, m.at, m.exported ? m.registration : 0};
    }

    // The peer's allocation behind `handle`, opened once per collective: a handle names one
    // allocation (CUDA's differ for two allocations at one address), so an open entry is the
    // same memory.
    void* open_exposure(rank_t from, typename Device::handle const& handle) {
        auto& opened = peer_of(from).exposures;
        for (auto const& c : opened)
            if (std::memcmp(&c.handle, &handle, sizeof handle) == 0) return c.base;
        void* base = device_.open_handle(handle);
        opened.push_back({handle, base});
        return base;
    }

    // The peer's allocation of its registration `id`, opened by the round that made it and kept
    // until the registration ends.
    void* kept_exposure(rank_t from, std::uint64_t id, typename Device::handle const& handle) {
        if (void* base = kept_base(from, id)) return base;
        void* base = device_.open_handle(handle);
        peer_of(from).kept.push_back({handle, base, id});
        return base;
    }
    // The peer's allocation of its registration `id` if this rank keeps it open, else null.
    void* kept_base(rank_t from, std::uint64_t id) const noexcept {
        for (auto const& k : peers_[static_cast<std::size_t>(from)].kept)
            if (k.registration == id) return k.base;
        return nullptr;
    }

    // Closes every peer allocation opened for exposures. CUDA IPC forbids freeing memory that
    // a peer still has open, and a caller frees its vector when it likes once the collective
    // returned: a collective's closing round (a slot round after exposures) closes them after
    // this rank's reads completed and before its record leaves, and the exposing rank returns
    // only once every peer's record came.
    void close_exposures() noexcept {
        for (auto& q : peers_) close_all(q.exposures);
    }
    void close_all(std::vector<opened_exposure>& opened) noexcept {
        for (auto& c : opened) device_.close_handle(c.base);
        opened.clear();
    }

    // A peer is at most one round ahead (it needs this rank's record of a round to leave it):
    // anything else is a corrupt record, which must not show another round's block.
    // The group fails on every rank, as for a control word out of order.
    void check_round(rank_t from, std::uint64_t round) {
        if (round == round_ || round == round_ + 1) return;
        std::string const what = "staged transport: rank " + std::to_string(from) + " announced direct round " + std::to_string(round) +
                                 " while rank " + std::to_string(me_) + " is at round " + std::to_string(round_) +
                                 " (a corrupt control record)";
        abort(what);
        throw transport_error(errc::peer_failed, from, what);
    }

    // Direct exchanges: waits until `ready()`, moving messages, as a receive of `tag` from
    // `awaited()` waits (whose timeout and failure it reports). A peer that sends this rank
    // messages of the collective it exchanges in called it with another size.
    // A device error in `ready()` (an event query reports any earlier failure on the stream)
    // fails the engine, and the peers hear of it.
    template <class Ready, class Awaited>
    void wait_direct(Ready const& ready, tag_t tag, Awaited const& awaited, clock::time_point deadline) {
        message_op op;
        op.tag = tag;
        wait_until(
            op, deadline,
            [&] {
                bool ok = false;
                failing_on_error([&] { ok = ready(); });
                return ok;
            },
            [&] {
                op.peer = awaited();
                for (rank_t r = 0; r < size() && !op.done; ++r) {
                    auto const& messages = peer_of(r).queue.messages();
                    if (r != me_ && std::ranges::any_of(messages, [&](unexpected_ptr const& u) { return u->tag == tag; })) {
                        op.peer = r;
                        op.fail(errc::size_mismatch, direct_mismatch_message(me_, tag, r, true));
                    }
                }
            },
            [] {});
    }

    // Every wait's loop: moves messages until `ready()`. Otherwise it ends when the group failed
    // (rethrown), `op` failed (`check()`, called while it has not, may fail it) or the deadline
    // passed: `leave()` undoes what the wait had posted, the group is aborted (its abort words
    // raised), the device settles (no copy stays queued into a buffer the caller frees while the
    // error unwinds), and op is reported as a receive's wait reports it (its error, or the
    // timeout naming op.peer).
    template <class Ready, class Check, class Leave>
    void wait_until(message_op& op, clock::time_point deadline, Ready const& ready, Check const& check, Leave const& leave) {
        for (;;) {
            progress();
            if (ready()) return;
            if (op.done) break;
            signals_failed();  // a launch queued before this wait failed: the device named the culprit
            if (failure_) {
                leave();
                settle_device();
                std::rethrow_exception(failure_);
            }
            check();
            if (op.done || clock::now() > deadline) break;
            std::this_thread::yield();
        }
        leave();
        if (op.done && !op.failed()) return settle_device();
        // The abort goes out before the device settles: a signaled launch of this rank still
        // spinning (queued behind other work, it started late) stops at its abort word, where
        // settling first would wait for its own deadline — up to a second timeout.
        try {
            conclude_wait(op, me_, timeout_, [&](std::string const& what) { abort(what); });
        } catch (...) {  // the wait's error (or no memory for its message): settle on every path
            settle_device();
            throw;
        }
    }

    // A receive from a peer that announced a direct round of the receive's collective, one this
    // rank has not entered: it called the collective with another size.
    bool exchanges_instead(staged_op const& op) const noexcept {
        if (op.is_send || op.peer == me_) return false;
        direct_record const& next = peers_[static_cast<std::size_t>(op.peer)].direct[(round_ + 1) & 1];
        return next.round == round_ + 1 && next.tag == op.tag;
    }

    Device device_;
    std::size_t chunk_, slots_, direct_bytes_, rendezvous_bytes_;
    std::chrono::milliseconds timeout_;
    std::optional<Control> control_;
    rank_t me_ = 0;
    void* fifo_ = nullptr;
    hello own_hello_{};
    std::vector<hello> handles_;  // the peers', as they arrive
    std::uint64_t round_ = 0;     // of direct exchanges
    std::optional<own_export> last_export_;
    std::vector<own_registration> registered_;  // this rank's buffers every peer keeps open
    std::uint64_t registrations_ = 0;           // keep() calls so far
    std::vector<peer_state> peers_;
    std::uint64_t sequence_ = 0;
    std::exception_ptr failure_;
    bool closing_ = false;
    bool signals_;                // this rank asked for signaled launches, and its device runs them
    bool peers_heard_ = false;    // every peer's set-up message came
    bool all_signal_ = false;     // and every rank asked for signaled launches
    bool launched_ = false;       // a signaled launch was queued (its status may say it failed)
    bool raised_ = false;         // this rank raised the abort word of every rank's pad
    std::string (*describe_)(std::uint64_t) = nullptr;  // a shape in words, for a failure's text
};

} // namespace chorus::detail
