// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Signaled launches (transport/concepts.hpp, signaling_transport): a collective that runs whole
// on the device, one launch per call, its ranks synchronising through flags in each other's
// memory — no host round trip, nothing for the host to wait for, so it can be captured into a
// CUDA graph. The primitives are MSCCL++'s (put, signal, wait): a rank writes its block into its
// own slot, signals every peer, waits for their signals, and reads their slots where they lie.
// This header holds what the device and its host model share: the layout, the protocol, and
// the runner of the host model. The CUDA kernel is in cuda_ipc.hpp.
//
// Layout: each rank's shared allocation (the staged engine's, behind its direct slots) holds a
// signal_pad, then two slots of direct_bytes. Launches are counted on the device (the pad's
// `launches`, so that a replayed graph counts too); launch k (from 0) uses slot k % 2 and
// shape words shape[k % 2], and signals the number k + 1 (the pad starts zeroed).
//
// Lanes: a launch runs in lanes (a block of threads on a GPU), each with its own flags: lane b
// of rank r signals lane b of every peer and waits only for lane b of every peer. A body
// partitions its elements by lane, so that lane b reads of a peer's slot only what the peer's
// lane b wrote before signalling. Every rank runs the same lanes for the same bytes.
//
// barrier(phase), per lane: every thread's writes to the slot are done (lane_sync), a fence
// makes them visible system-wide, then the shape (collective, bytes, root) goes into
// shape[k % 2][b][r] of each peer q's pad and k + 1 into its flag[phase][b][r] (release, system
// scope); then the lane waits (acquire) until flag[phase][b][q] of its own pad reaches k + 1 for
// every q, and compares every rank's shape with rank 0's.
//
// Why no closing barrier: rank r writes slot k % 2 again at launch k + 2, which starts only once
// its launch k + 1 completed — whose lane 0 waited for every peer's launch k + 1 to start, so
// every peer's launch k (all its lanes, whatever their partition) had completed: no peer still
// reads slot k % 2. The same argument keeps shape[k % 2] stable while a peer reads it, and a
// peer can never be two launches ahead of a waiting rank.
//
// Failure: every wait has a deadline (the transport's timeout) and watches the pad's `abort`
// word. A lane that times out, or finds a rank that called with another shape, raises `abort`
// in every rank's pad (naming the rank to blame, the reason and itself), so that every lane
// of every rank stops within microseconds rather than its own timeout; so does a rank whose
// host fails the group (the transport writes the word from the host). The first failure of a
// rank goes to its host-visible signal_status, which the host turns into an exception on its
// next call into the transport (with every rank's text naming the same culprit). A launch
// that finds an abort raised fails too, even once its flags came: the group is failed.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

#include <chorus/config.hpp>
#include <chorus/detail/elementwise.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail {

inline constexpr rank_t signal_max_ranks = 16;
inline constexpr unsigned signal_max_lanes = 64;
inline constexpr int signal_phases = 2;
/// Bytes a lane covers at least, before a launch takes another lane.
inline constexpr std::size_t signal_lane_bytes = std::size_t{16} << 10;

/// The lanes of a launch of `bytes` at p ranks: enough that each covers about
/// signal_lane_bytes, at most signal_max_lanes / p, so that the p ranks' lanes (blocks) are all
/// resident on one GPU at once (MPS runs them side by side; a lane that waits for one not yet
/// scheduled would wait for it until the timeout).
constexpr unsigned signal_lanes(std::size_t bytes, rank_t p) noexcept {
    std::size_t const most = p > 0 && signal_max_lanes / static_cast<unsigned>(p) > 1 ? signal_max_lanes / static_cast<unsigned>(p) : 1;
    std::size_t const wanted = (bytes + signal_lane_bytes - 1) / signal_lane_bytes;
    return static_cast<unsigned>(wanted < 1 ? 1 : wanted > most ? most : wanted);
}

/// What a rank's peers write into its memory, and what its own lanes share.
struct signal_pad {
    std::uint64_t flag[signal_phases][signal_max_lanes][signal_max_ranks];  // [phase][lane][from] = launch + 1
    std::uint64_t shape[2][signal_max_lanes][signal_max_ranks];            // [launch % 2][lane][from]
    std::uint64_t launches;   // launches this rank completed (its lanes' count)
    std::uint64_t lanes_done; // lanes of the current launch that finished
    std::uint64_t abort;      // 0, or signal_abort_word(): every lane of every rank stops
    std::uint64_t failed;     // 0, or 1 once this rank wrote its signal_status
};

/// Why a launch failed: a rank did not come within the timeout, ranks came with other shapes,
/// or a rank's host failed the group (its transport raised the abort word from the host).
enum class signal_failure : std::uint32_t { none = 0, timeout = 1, mismatch = 2, host = 3 };

/// The abort word: the reason, the low 24 bits of the launch that found it, the rank to blame
/// and the rank that found it (ranks + 1).
CHORUS_HOST_DEVICE constexpr std::uint64_t signal_abort_word(signal_failure why, std::uint64_t launch, rank_t culprit,
                                                             rank_t finder) noexcept {
    return std::uint64_t{static_cast<std::uint32_t>(why)} << 56 | (launch & 0xffffff) << 32 |
           (static_cast<std::uint64_t>(culprit + 1) & 0xffff) << 16 | (static_cast<std::uint64_t>(finder + 1) & 0xffff);
}
struct signal_abort {
    signal_failure why;
    std::uint64_t launch;  // low 24 bits
    rank_t culprit, finder;
};
CHORUS_HOST_DEVICE constexpr signal_abort read_abort_word(std::uint64_t w) noexcept {
    return {static_cast<signal_failure>(w >> 56), (w >> 32) & 0xffffff, static_cast<rank_t>((w >> 16) & 0xffff) - 1,
            static_cast<rank_t>(w & 0xffff) - 1};
}

/// A rank's first failure in a launch, for its host (host memory the device writes).
struct signal_status {
    std::uint32_t code;    // signal_failure; written last, once the rest is in place
    std::int32_t culprit;  // the rank to blame
    std::int32_t finder;   // the rank that found it (this one, or the one whose abort stopped it)
    std::uint32_t lane;
    std::uint64_t shape;          // the failed launch's
    std::uint64_t theirs, first;  // mismatch, found here: the culprit's shape and rank 0's
};

/// What a launch that runs in the host's thread (the host model) calls while it waits: the
/// transport's progress, so that messages in flight keep moving. A GPU's launch ignores it.
struct signal_poll {
    void (*fn)(void*) = nullptr;
    void* context = nullptr;
};

/// A body that does nothing: what concepts check a launch with.
struct signal_probe {
    template <class Channel>
    CHORUS_HOST_DEVICE void operator()(Channel&) const {}
};

/// A launch's arguments: where every rank's allocation lies here, where the pad and the slots
/// lie in it, this launch's shape, the deadline of each wait, and where failures go.
struct signal_args {
    std::byte* base[signal_max_ranks];
    std::size_t pad_offset, slot_offset, slot_stride;
    std::uint64_t shape;
    std::uint64_t timeout_ns;
    signal_status* status;
    rank_t rank, size;
};

/// What a lane's threads share (__shared__ on a GPU).
struct signal_lane_state {
    std::uint64_t launch;
    int failed;
};

/// A lane's view of a signaled launch, over `Sync` (the executor's primitives: lanes, threads,
/// atomics, clock). What a body (a collective's lanes) uses: rank(), size(), lane(), lanes(),
/// thread(), threads(), own() (this rank's slot of the launch), slot(q) (q's, where it lies),
/// load() (a read of a peer's slot) and barrier(phase) (false: the launch failed, return).
template <class Sync>
class signal_channel {
public:
    CHORUS_HOST_DEVICE signal_channel(signal_args const& a, signal_lane_state& s, Sync sync) : a_(a), s_(s), sync_(sync) {}

    CHORUS_HOST_DEVICE rank_t rank() const { return a_.rank; }
    CHORUS_HOST_DEVICE rank_t size() const { return a_.size; }
    CHORUS_HOST_DEVICE unsigned lane() const { return sync_.lane(); }
    CHORUS_HOST_DEVICE unsigned lanes() const { return sync_.lanes(); }
    CHORUS_HOST_DEVICE unsigned thread() const { return sync_.thread(); }
    CHORUS_HOST_DEVICE unsigned threads() const { return sync_.threads(); }
    CHORUS_HOST_DEVICE std::byte* own() const { return slot_of(a_.rank); }
    CHORUS_HOST_DEVICE std::byte const* slot(rank_t q) const { return slot_of(q); }
    template <class T>
    CHORUS_HOST_DEVICE T load(T const* p) const {
        return sync_.load(p);
    }
    /// 16 bytes of elements at `p`, 16-byte aligned, read as load() reads one.
    template <class T>
    CHORUS_HOST_DEVICE wide_vector<T> load_wide(T const* p) const {
        return sync_.load_wide(p);
    }

    /// Before the body: the launch's number, from this rank's pad.
    CHORUS_HOST_DEVICE void begin() {
        if (thread() == 0) {
            s_.launch = sync_.load_relaxed(pad(a_.rank).launches);
            s_.failed = 0;
        }
        sync_.lane_sync();
    }

    /// After the body: the last lane of the launch to finish counts it (the next launch, later
    /// on the stream, reads the count).
    CHORUS_HOST_DEVICE void finish() {
        sync_.lane_sync();
        if (thread() != 0) return;
        signal_pad& mine = pad(a_.rank);
        if (sync_.add_device(mine.lanes_done) + 1 == lanes()) {
            sync_.store_relaxed(mine.lanes_done, 0);
            sync_.store_relaxed(mine.launches, s_.launch + 1);
        }
    }

    CHORUS_HOST_DEVICE bool barrier(int phase) {
        sync_.lane_sync();
        std::uint64_t const k = s_.launch + 1;
        unsigned const b = lane();
        rank_t const me = a_.rank;
        for (rank_t q = static_cast<rank_t>(thread()); q < a_.size; q += static_cast<rank_t>(threads())) {
            if (q == me) continue;
            signal_pad& theirs = pad(q);
            sync_.fence_system();  // the lane's writes before the signal, visible to q first
            if (phase == 0) sync_.store_relaxed(theirs.shape[s_.launch & 1][b][me], a_.shape);
            sync_.store_release(theirs.flag[phase][b][me], k);
        }
        signal_pad& mine = pad(me);
        for (rank_t q = static_cast<rank_t>(thread()); q < a_.size; q += static_cast<rank_t>(threads()))
            if (q != me && !wait_for(mine, phase, b, q, k)) s_.failed = 1;
        sync_.fence_system();
        sync_.lane_sync();
        if (thread() == 0 && s_.failed == 0) {
            // Flags can also be reached after an abort (a rank that gave up waits no more, and
            // may run a launch ahead): an abort raised by now fails this launch too.
            std::uint64_t const w = sync_.load_acquire(mine.abort);
            if (w != 0 && !settles_itself(w, b)) {
                relay(w, b);
                s_.failed = 1;
            } else if (phase == 0) {
                check_shapes(mine, b);
                // The finder's launch saw shapes that a rank running ahead has overwritten since:
                // the mismatch is told as found there.
                if (w != 0 && s_.failed == 0) {
                    signal_abort const a = read_abort_word(w);
                    fail(a.why, a.culprit, a.finder, b, 0, 0);
                    s_.failed = 1;
                }
            }
        }
        sync_.lane_sync();
        return s_.failed == 0;
    }

private:
    // Rank 0's shape is the reference, so that every rank blames the same rank: the first whose
    // shape differs from rank 0's (the shapes stay in place for the whole launch, see above).
    CHORUS_HOST_DEVICE void check_shapes(signal_pad& mine, unsigned b) {
        auto const shape_of = [&](rank_t q) { return q == a_.rank ? a_.shape : sync_.load_relaxed(mine.shape[s_.launch & 1][b][q]); };
        std::uint64_t const first = shape_of(0);
        for (rank_t q = 1; q < a_.size; ++q) {
            std::uint64_t const theirs = shape_of(q);
            if (theirs == first) continue;
            fail(signal_failure::mismatch, q, a_.rank, b, theirs, first);
            s_.failed = 1;
            return;
        }
    }

    CHORUS_HOST_DEVICE signal_pad& pad(rank_t q) const {
        return *reinterpret_cast<signal_pad*>(a_.base[q] + a_.pad_offset);
    }
    CHORUS_HOST_DEVICE std::byte* slot_of(rank_t q) const {
        return a_.base[q] + a_.slot_offset + (s_.launch & 1) * a_.slot_stride;
    }

    // Until q's flag reaches k; false on the deadline or another rank's abort (recorded).
    CHORUS_HOST_DEVICE bool wait_for(signal_pad& mine, int phase, unsigned b, rank_t q, std::uint64_t k) {
        std::uint64_t const start = sync_.now_ns();
        for (unsigned spin = 1;; ++spin) {
            if (sync_.load_acquire(mine.flag[phase][b][q]) >= k) return true;
            if ((spin & 63u) == 0) {
                if (std::uint64_t const w = sync_.load_relaxed(mine.abort); w != 0 && !settles_itself(w, b)) {
                    relay(w, b);
                    return false;
                }
            }
            if ((spin & 1023u) == 0 && sync_.now_ns() - start > a_.timeout_ns) {
                fail(signal_failure::timeout, q, a_.rank, b, 0, 0);
                return false;
            }
            sync_.pause();
        }
    }

    // Ranks that called one launch with other shapes all came to it, so its lane 0 (which every
    // launch has) waits on for its flags and finds the culprit itself, with both shapes.
    CHORUS_HOST_DEVICE bool settles_itself(std::uint64_t w, unsigned b) const {
        signal_abort const a = read_abort_word(w);
        return a.why == signal_failure::mismatch && b == 0 && a.launch == (s_.launch & 0xffffff);
    }
    // Another rank's abort stops this lane; lane 0 tells a mismatch (with the shapes where it
    // finds them itself), the other lanes only stop.
    CHORUS_HOST_DEVICE void relay(std::uint64_t w, unsigned b) {
        signal_abort const a = read_abort_word(w);
        if (a.why != signal_failure::mismatch || b == 0) fail(a.why, a.culprit, a.finder, b, 0, 0);
    }

    // This rank's first failure goes to its host; one it found itself stops every rank.
    CHORUS_HOST_DEVICE void fail(signal_failure why, rank_t culprit, rank_t finder, unsigned b, std::uint64_t theirs,
                                 std::uint64_t first) {
        if (finder == a_.rank)
            for (rank_t r = 0; r < a_.size; ++r)
                sync_.store_release(pad(r).abort, signal_abort_word(why, s_.launch, culprit, finder));
        if (!sync_.claim(pad(a_.rank).failed)) return;
        signal_status& s = *a_.status;
        s.culprit = culprit;
        s.finder = finder;
        s.lane = b;
        s.shape = a_.shape;
        s.theirs = theirs;
        s.first = first;
        sync_.fence_system();
        sync_.publish(s.code, static_cast<std::uint32_t>(why));
    }

    signal_args const& a_;
    signal_lane_state& s_;
    Sync sync_;
};

/// The host model's primitives: one thread per lane, lanes one after another, std::atomic_ref
/// at sequentially consistent strength where the device's are system-scope.
struct host_signal_sync {
    unsigned lane_, lanes_;
    signal_poll poll_;
    unsigned lane() const { return lane_; }
    unsigned lanes() const { return lanes_; }
    static unsigned thread() { return 0; }
    static unsigned threads() { return 1; }
    static void lane_sync() {}
    static void fence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
    static std::uint64_t load_acquire(std::uint64_t& w) { return std::atomic_ref(w).load(std::memory_order_acquire); }
    static std::uint64_t load_relaxed(std::uint64_t& w) { return std::atomic_ref(w).load(std::memory_order_relaxed); }
    static void store_release(std::uint64_t& w, std::uint64_t v) { std::atomic_ref(w).store(v, std::memory_order_release); }
    static void store_relaxed(std::uint64_t& w, std::uint64_t v) { std::atomic_ref(w).store(v, std::memory_order_relaxed); }
    static std::uint64_t add_device(std::uint64_t& w) { return std::atomic_ref(w).fetch_add(1, std::memory_order_acq_rel); }
    static bool claim(std::uint64_t& w) {
        std::uint64_t expected = 0;
        return std::atomic_ref(w).compare_exchange_strong(expected, 1, std::memory_order_acq_rel);
    }
    static void publish(std::uint32_t& w, std::uint32_t v) { std::atomic_ref(w).store(v, std::memory_order_release); }
    static void raise(std::uint64_t& w, std::uint64_t v) { std::atomic_ref(w).store(v, std::memory_order_release); }
    static std::uint64_t now_ns() {
        return static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
    }
    void pause() const {
        if (poll_.fn) poll_.fn(poll_.context);
        std::this_thread::yield();
    }
    template <class T>
    static T load(T const* p) {
        return *p;
    }
    template <class T>
    static wide_vector<T> load_wide(T const* p) {
        return plain_loads{}.load_wide(p);
    }
};

/// Runs a signaled launch in the calling thread, lane after lane (the host model of a device:
/// lane b of every rank pairs with lane b of its peers only, so no rank waits for a lane its
/// peer runs later).
template <class Body>
void run_signaled_on_host(signal_args const& a, unsigned lanes, Body const& body, signal_poll poll = {}) {
    for (unsigned b = 0; b < lanes; ++b) {
        signal_lane_state state{};
        signal_channel<host_signal_sync> c(a, state, host_signal_sync{b, lanes, poll});
        c.begin();
        body(c);
        c.finish();
    }
}

/// A host-visible status's failure, read once it was published (code last).
inline signal_status read_signal_status(signal_status const* s) noexcept {
    signal_status out{};
    out.code = std::atomic_ref(const_cast<signal_status*>(s)->code).load(std::memory_order_acquire);
    if (out.code == 0) return out;
    std::memcpy(&out, s, sizeof out);
    out.code = std::atomic_ref(const_cast<signal_status*>(s)->code).load(std::memory_order_acquire);
    return out;
}

/// A lane's share of n elements: contiguous, in multiples of 64 elements.
struct lane_span {
    std::size_t first, last;
};
CHORUS_HOST_DEVICE constexpr lane_span lane_share(std::size_t n, unsigned lane, unsigned lanes) noexcept {
    std::size_t per = (n + lanes - 1) / lanes;
    per = (per + 63) / 64 * 64;
    std::size_t const first = per * lane < n ? per * lane : n;
    return {first, first + per < n ? first + per : n};
}

} // namespace chorus::detail
