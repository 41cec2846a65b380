// SPDX-License-Identifier: MIT
#pragma once

// A host model of a device for staged_engine, so that the staged protocol (CUDA IPC's) runs
// and is tested without a GPU: ranks are threads of one process, "device" memory is heap
// memory, a handle is an address, and copies are asynchronous as on a stream — queued and
// executed in order, one per completion poll, so completion lags enqueueing as it does on a
// device and the pipelining paths (several chunks in flight, late events) are exercised.
// One mutex serialises the copies of all ranks: the receiver reads a slot only after the
// sender's copy into it, both under the lock, which is also the order ThreadSanitizer sees.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <vector>

#include <chorus/detail/elementwise.hpp>
#include <chorus/error.hpp>
#include <chorus/memory.hpp>
#include <chorus/transport/signals.hpp>

namespace testing_support {

class host_model_device {
public:
    using memory_space = chorus::host_memory;
    using handle = std::uintptr_t;
    struct event {
        std::uint64_t upto;
    };

    // Aligned as a device allocation is (the direct slots' blocks rely on it).
    static constexpr std::align_val_t shared_alignment{256};
    void* allocate_shared(std::size_t bytes) { return ::operator new(bytes ? bytes : 1, shared_alignment); }
    void release_shared(void* p) noexcept {
        ++released_fifos;
        ::operator delete(p, shared_alignment);
    }
    // Another rank (thread) may still copy into it: kept until the program ends, as a process's
    // exit reclaims an abandoned CUDA FIFO.
    void abandon_shared(void* p) noexcept {
        ++abandoned_fifos;
        try {
            struct deleter {
                void operator()(void* q) const noexcept { ::operator delete(q, shared_alignment); }
            };
            static std::mutex m;
            static std::vector<std::unique_ptr<void, deleter>> kept;
            std::lock_guard lock(m);
            kept.emplace_back(p);
        } catch (...) {  // out of memory: leaked, as on a device
        }
    }
    // Faults a test can inject into this rank: a thread on the wrong device, a failing copy.
    bool wrong_device = false;
    bool fail_copies = false;
    bool fail_completion = false;  // an event query reports an error (as CUDA's does a kernel's)
    void check_current(bool /*capturing*/ = false) const {
        if (wrong_device) throw chorus::invalid_argument("host model: this thread's current device is not the transport's");
    }
    struct current_scope {};
    current_scope scoped_current() const noexcept { return {}; }
    void* allocate(std::size_t bytes) { return ::operator new(bytes ? bytes : 1); }
    void release(void* p) noexcept { ::operator delete(p); }
    handle export_handle(void* base) { return reinterpret_cast<handle>(base); }
    void* open_handle(handle const& h) {
        ++open_handles;
        ++opens;
        ++open_here;
        return reinterpret_cast<void*>(h);
    }
    void close_handle(void*) noexcept {
        --open_handles;
        --open_here;
    }
    // Any memory of the process is exported (ranks are threads), unless a test refuses it (a
    // device refuses memory it cannot share, such as CUDA's stream-ordered pools). As if
    // memory were allocated in 4 KiB pieces: the handle names the piece, the offset the place
    // in it (buffers share pieces, and start inside them, as they do in CUDA allocations).
    struct exported {
        std::uintptr_t handle;
        std::size_t offset;
    };
    bool refuse_export = false;
    long exports = 0;  // buffers this rank exported so far
    std::optional<exported> export_range(void const* p, std::size_t) {
        if (refuse_export) return std::nullopt;
        ++exports;
        auto const at = reinterpret_cast<std::uintptr_t>(p);
        return exported{at & ~std::uintptr_t{4095}, at & 4095};
    }

    void copy(void* dst, void const* src, std::size_t bytes) {
        if (fail_copies) throw chorus::device_error("host model: copy failed (injected)");
        pending_.push_back({dst, src, bytes});
        ++enqueued_;
        ++copies;
    }
    event record() noexcept { return {enqueued_}; }
    bool done(event& e) {
        if (fail_completion) throw chorus::device_error("host model: queued work failed (injected)");
        if (executed_ < e.upto) run_one();
        return executed_ >= e.upto;
    }
    void release(event&) noexcept {}
    void synchronize() noexcept {
        while (executed_ < enqueued_) run_one();
    }

    // Signaled launches (signals.hpp), run at once in the rank's thread once its queued copies
    // ran (a stream's order): lane after lane, each waiting for its peers' (other threads) and
    // moving the transport's messages meanwhile (`poll`), as a host does beside a GPU's kernel.
    template <class Body>
    void launch(chorus::detail::signal_args const& a, unsigned lanes, Body const& body, chorus::detail::signal_poll poll) {
        synchronize();
        ++launches;
        last_lanes = lanes;
        chorus::detail::run_signaled_on_host(a, lanes, body, poll);
    }
    chorus::detail::signal_status* failure_status() noexcept { return &status_; }
    void raise(std::uint64_t* word, std::uint64_t value) noexcept { chorus::detail::host_signal_sync::raise(*word, value); }
    long launches = 0;        // signaled launches of this rank so far
    unsigned last_lanes = 0;  // and the lanes of its latest

    /// Peer handles open now, over all ranks of the process: 0 once every transport closed.
    static inline std::atomic<long> open_handles{0};
    /// FIFOs freed (every peer said goodbye) and abandoned (one may still use it), all ranks.
    static inline std::atomic<long> released_fifos{0}, abandoned_fifos{0};
    long copies = 0;  // copies enqueued so far by this rank
    long opens = 0;      // handles this rank opened so far
    long open_here = 0;  // handles this rank has open now

private:
    struct pending_copy {
        void* dst;
        void const* src;
        std::size_t bytes;
    };
    static std::mutex& copy_mutex() {
        static std::mutex m;
        return m;
    }
    void run_one() noexcept {
        pending_copy const c = pending_.front();
        pending_.pop_front();
        {
            std::lock_guard lock(copy_mutex());
            std::memcpy(c.dst, c.src, c.bytes);
        }
        ++executed_;
    }
    std::deque<pending_copy> pending_;
    chorus::detail::signal_status status_{};
    std::uint64_t enqueued_ = 0, executed_ = 0;
};

/// Host memory that also folds many operands in one pass, as a device's memory space does
/// (detail::folding_space; cuda_device_memory folds in one kernel), up to 3 at once: the
/// one_shot fold's one-pass path runs at 2 and 3 ranks, the pairwise one beyond. Its fold,
/// reduce and finalize are cuda_device_memory's passes (detail::fold_elements with the same
/// operands, step and finish), each thread of a 5-thread "grid" in turn.
struct folding_host_memory : chorus::host_memory {
    static constexpr std::size_t max_fold = 3;
    static inline std::atomic<long> folds{0};
    template <class T, class Step, class Finish>
    static void pass(T* out, std::span<T const* const> parts, std::size_t n, Step const& step, Finish const& finish) {
        constexpr std::size_t threads = 5;
        for (std::size_t t = 0; t < threads; ++t)
            chorus::detail::fold_elements(out, chorus::detail::operand_array<T>{parts.data()}, static_cast<unsigned>(parts.size()), n, t,
                                          threads, step, finish);
    }
    template <class T, class Op>
    static void fold(std::span<T> out, std::span<T const* const> parts, Op const& op, chorus::rank_t p) {
        ++folds;
        pass(out.data(), parts, out.size(), op, chorus::detail::op_finish<Op>{op, p});
    }
    template <class T, class Op>
    static void reduce(std::span<T> out, std::span<T const> a, std::span<T const> b, Op const& op) {
        std::array<T const*, 2> const parts{a.data(), b.data()};
        pass(out.data(), std::span<T const* const>(parts), out.size(), op, chorus::detail::keep_value{});
    }
    template <class T, class Op>
    static void reduce(std::span<T> acc, std::span<T const> in, Op const& op, bool in_first) {
        if (in_first) reduce(acc, in, std::span<T const>(acc), op);
        else reduce(acc, std::span<T const>(acc), in, op);
    }
    template <class T, class Op>
    static void finalize(std::span<T> data, Op const& op, chorus::rank_t p) {
        if constexpr (chorus::has_finalize<Op, T>) {
            std::array<T const*, 1> const parts{data.data()};
            pass(data.data(), std::span<T const* const>(parts), data.size(), chorus::detail::keep_value{}, chorus::detail::op_finish<Op>{op, p});
        }
    }
};

/// The host model with a folding memory space.
struct folding_host_model_device : host_model_device {
    using memory_space = folding_host_memory;
};

} // namespace testing_support
