// SPDX-License-Identifier: MIT
#pragma once

// A host model of a device for staged_engine, so that the staged protocol (CUDA IPC's) runs
// and is tested without a GPU: ranks are threads of one process, "device" memory is heap
// memory, a handle is an address, and copies are asynchronous as on a stream — queued and
// executed in order, one per completion poll, so completion lags enqueueing as it does on a
// device and the pipelining paths (several chunks in flight, late events) are exercised.
// One mutex serialises the copies of all ranks: the receiver reads a slot only after the
// sender's copy into it, both under the lock, which is also the order ThreadSanitizer sees.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <chorus/error.hpp>
#include <chorus/memory.hpp>

namespace testing_support {

class host_model_device {
public:
    using memory_space = chorus::host_memory;
    using handle = std::uintptr_t;
    struct event {
        std::uint64_t upto;
    };

    void* allocate_shared(std::size_t bytes) { return ::operator new(bytes ? bytes : 1); }
    void release_shared(void* p) noexcept {
        ++released_fifos;
        ::operator delete(p);
    }
    // Another rank (thread) may still copy into it: kept until the program ends, as a process's
    // exit reclaims an abandoned CUDA FIFO.
    void abandon_shared(void* p) noexcept {
        ++abandoned_fifos;
        try {
            struct deleter {
                void operator()(void* q) const noexcept { ::operator delete(q); }
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
    void check_current() const {
        if (wrong_device) throw chorus::invalid_argument("host model: this thread's current device is not the transport's");
    }
    struct current_scope {};
    current_scope scoped_current() const noexcept { return {}; }
    void* allocate(std::size_t bytes) { return ::operator new(bytes ? bytes : 1); }
    void release(void* p) noexcept { ::operator delete(p); }
    handle export_handle(void* base) { return reinterpret_cast<handle>(base); }
    void* open_handle(handle const& h) {
        ++open_handles;
        return reinterpret_cast<void*>(h);
    }
    void close_handle(void*) noexcept { --open_handles; }

    void copy(void* dst, void const* src, std::size_t bytes) {
        if (fail_copies) throw chorus::device_error("host model: copy failed (injected)");
        pending_.push_back({dst, src, bytes});
        ++enqueued_;
        ++copies;
    }
    event record() noexcept { return {enqueued_}; }
    bool done(event& e) {
        if (executed_ < e.upto) run_one();
        return executed_ >= e.upto;
    }
    void release(event&) noexcept {}
    void synchronize() noexcept {
        while (executed_ < enqueued_) run_one();
    }

    /// Peer handles open now, over all ranks of the process: 0 once every transport closed.
    static inline std::atomic<long> open_handles{0};
    /// FIFOs freed (every peer said goodbye) and abandoned (one may still use it), all ranks.
    static inline std::atomic<long> released_fifos{0}, abandoned_fifos{0};
    long copies = 0;  // copies enqueued so far by this rank

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
    std::uint64_t enqueued_ = 0, executed_ = 0;
};

} // namespace testing_support
