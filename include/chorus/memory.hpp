// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Memory spaces: where a transport's buffers live, and therefore where an algorithm's scratch
// is allocated and where its reductions run. One algorithm template serves host and device
// transports by calling these through `typename Transport::memory_space`.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>  // madvise: huge pages for large scratch
#endif
#if defined(__SSE2__)
#include <emmintrin.h>  // streaming stores for copies past the cache
#endif

#include <chorus/config.hpp>
#include <chorus/detail/env.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/traits.hpp>

namespace chorus {

namespace detail {

// Elements per block of the host reduction kernels. g++ 12 at -O2 vectorises with the
// "very cheap" cost model, which rejects any loop that would need a scalar epilogue (a trip
// count not known to be a multiple of the vector width) or a runtime alias check: the plain
// `for (i < n) o[i] = op(a[i], b[i])` stays scalar. An inner loop of fixed length 16 (a
// multiple of the vector width for 4- and 8-byte elements, up to AVX-512) over __restrict
// pointers needs neither, so it vectorises; the < 16 leftover elements run as a scalar tail.
inline constexpr std::size_t reduce_block = 16;

// out[i] = op(a[i], b[i]) for three disjoint arrays.
template <class T, class Op>
void reduce_disjoint(T* __restrict out, T const* __restrict a, T const* __restrict b, std::size_t n,
                     Op const& op) noexcept {
    std::size_t i = 0;
    for (; n - i >= reduce_block; i += reduce_block)
        for (std::size_t j = 0; j < reduce_block; ++j) out[i + j] = static_cast<T>(op(a[i + j], b[i + j]));
    for (; i < n; ++i) out[i] = static_cast<T>(op(a[i], b[i]));
}

// acc[i] = op(acc[i], in[i]) (AccFirst) or op(in[i], acc[i]); `in` does not overlap `acc`.
// A separate kernel, since `acc` is both read and written: declaring it and an input both
// __restrict would be undefined.
template <bool AccFirst, class T, class Op>
void reduce_into(T* __restrict acc, T const* __restrict in, std::size_t n, Op const& op) noexcept {
    auto const one = [&](std::size_t k) {
        if constexpr (AccFirst) acc[k] = static_cast<T>(op(acc[k], in[k]));
        else acc[k] = static_cast<T>(op(in[k], acc[k]));
    };
    std::size_t i = 0;
    for (; n - i >= reduce_block; i += reduce_block)
        for (std::size_t j = 0; j < reduce_block; ++j) one(i + j);
    for (; i < n; ++i) one(i);
}

// out[i] = op(a[i], b[i]) where the inputs coincide (and `out` may be one of them); not a
// case the algorithms produce, kept correct and plain.
template <class T, class Op>
void reduce_aliased(T* out, T const* a, T const* b, std::size_t n, Op const& op) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(op(a[i], b[i]));
}

// Large scratch blocks kept for reuse, per thread. An algorithm's scratch of a large collective
// is as large as the message, and the next collective wants the same again: allocated afresh,
// every block is new pages from the kernel (glibc maps blocks of 32 MiB and more itself, and
// unmaps them on free), each faulted in on first touch — on the 2-core CI VM that made a
// 64 MiB tree allreduce over shared memory 25x slower than the copies it does. So blocks of
// at least `min_bytes` go back to this cache when freed (at most `max_blocks`, `max_bytes`
// in all, the oldest dropped first), and a request takes the smallest cached block that
// fits without wasting more than its own size again. Memory is held until the thread exits.
// From 16 KiB: blocks between that and glibc's mmap threshold come from the heap, whose top
// glibc gives back to the kernel when it grows free, so they churn pages too — a hierarchical
// allreduce of 256 KiB (a block buffer, and the scratch of the three collectives inside it)
// took 2.5 ms instead of 0.37 ms with 256 KiB as the limit. Eight blocks: nested collectives
// hold several at once. Blocks of 2 MiB and more are asked to be transparent huge pages
// (madvise; the default "madvise" mode of most distributions honours nothing else): on that VM
// a 4 KiB page faults in for 11 us, a 2 MiB one for 0.5 ms, 45x less per byte.
class scratch_cache {
public:
    static constexpr std::size_t min_bytes = std::size_t{16} << 10;
    static constexpr std::size_t max_blocks = 8;
    static constexpr std::size_t max_bytes = std::size_t{512} << 20;

    static std::byte* take(std::size_t bytes, std::size_t& capacity) {
        if (bytes >= min_bytes && !gone()) {
            auto& c = instance();
            std::size_t best = c.count_;
            for (std::size_t i = 0; i < c.count_; ++i)
                if (c.blocks_[i].bytes >= bytes && c.blocks_[i].bytes <= 2 * bytes &&
                    (best == c.count_ || c.blocks_[i].bytes < c.blocks_[best].bytes))
                    best = i;
            if (best != c.count_) {
                block const b = c.blocks_[best];
                c.erase(best);
                capacity = b.bytes;
                return b.data;
            }
        }
        capacity = bytes;
        auto* const data = static_cast<std::byte*>(::operator new(bytes, alignment(bytes)));
#if defined(__linux__)
        if (bytes >= huge_page) ::madvise(data, bytes / huge_page * huge_page, MADV_HUGEPAGE);  // advice: may be refused
#endif
        return data;
    }

    static void give(std::byte* data, std::size_t capacity) noexcept {
        if (!data) return;
        // After the thread's cache was destroyed (a transport destroyed after the thread's
        // thread_locals, as a static one is), blocks go straight back.
        if (capacity < min_bytes || capacity > max_bytes || gone()) return release(data, capacity);
        auto& c = instance();
        while (c.count_ == max_blocks || (c.count_ != 0 && c.total_ + capacity > max_bytes)) {
            release(c.blocks_[0].data, c.blocks_[0].bytes);
            c.erase(0);
        }
        c.blocks_[c.count_++] = {data, capacity};
        c.total_ += capacity;
    }

    scratch_cache() = default;
    scratch_cache(scratch_cache const&) = delete;
    scratch_cache& operator=(scratch_cache const&) = delete;
    ~scratch_cache() {
        for (std::size_t i = 0; i < count_; ++i) release(blocks_[i].data, blocks_[i].bytes);
        count_ = total_ = 0;
        gone() = true;
    }

private:
    struct block {
        std::byte* data;
        std::size_t bytes;
    };
    static bool& gone() noexcept {
        thread_local bool destroyed = false;  // trivial: alive as long as the thread
        return destroyed;
    }
    static scratch_cache& instance() noexcept {
        thread_local scratch_cache c;
        return c;
    }
    static constexpr std::size_t huge_page = std::size_t{2} << 20;
    static std::align_val_t alignment(std::size_t bytes) noexcept {
        return std::align_val_t{bytes >= huge_page ? huge_page : 64};
    }
    static void release(std::byte* data, std::size_t capacity) noexcept { ::operator delete(data, alignment(capacity)); }
    void erase(std::size_t i) noexcept {
        total_ -= blocks_[i].bytes;
        for (std::size_t j = i + 1; j < count_; ++j) blocks_[j - 1] = blocks_[j];
        --count_;
    }
    block blocks_[max_blocks]{};
    std::size_t count_ = 0;
    std::size_t total_ = 0;
};

// Copies past the cache. A copy of a collective's block of tens of MiB into a buffer that is
// not in cache streams memory: ordinary stores first read every destination line they write
// (read for ownership), so a copy moves three bytes per byte, where streaming (non-temporal)
// stores write whole lines without reading them and move two. glibc's memcpy streams only from
// three quarters of the last-level cache it is told of, which a VM may report as its host's
// whole L3 (the 2-core CI VM: 300 MiB, so never below 114 MiB). Measured there (two ranks, each
// copying its own block while the kernel reads the peer's, as a 2-rank allgather does): a
// 32 MiB block 4.8-5.6 -> 3.4 ms; over shm, 2-rank allgather and alltoall of 64 and 128 MiB
// 6-15% faster, 4-rank allgather of 64 MiB 10-12%. Below that, streaming loses where the
// destination is still cached (a buffer its owner has just written): 2-rank allgather of
// 4-16 MiB (blocks of 2-8 MiB) up to 1.5x slower, and so did copies of 16 MiB into a buffer of
// 32 (2-rank allgather of 32 MiB 3.35-3.37 against 2.53-2.66 ms) or 16 (4-rank broadcast of
// 16 MiB from registered memory 5.2-6.1 against 3.9), while 16 MiB blocks of a 64 MiB 4-rank
// allgather gained (17.3 -> 13.3). What decides is the buffer written, not the copy: the
// collectives pass it (host_memory::copy_part), and copies into buffers of 64 MiB and more
// stream (CHORUS_NT_COPY_BYTES; 0: never), read once per process. tcp_transport's from_env (and so
// shm's and node's) checks the variable, failing there with a clear error; a program that builds
// its transports from configs gets a line on stderr and the default instead of an exception in
// the middle of a collective, which only the ranks that copy would throw.
inline std::size_t nt_copy_bytes() {
    static std::size_t const bytes = [] {
        try {
            return nt_copy_bytes_from(env_reader("chorus::host_memory::copy"));
        } catch (invalid_argument const& e) {
            std::fprintf(stderr, "%s; copies stream from the default, %zu bytes\n", e.what(), nt_copy_bytes_default);
            return nt_copy_bytes_default;
        }
    }();
    return bytes;
}

// memcpy through streaming stores: the head up to the destination's next 64-byte boundary and
// the tail by memcpy, whole lines in between (SSE2: every x86-64 has it; elsewhere, memcpy). Ordered before any
// later store by the closing sfence, like memcpy's own streaming loop.
inline void streaming_copy(void* dst, void const* src, std::size_t n) noexcept {
#if defined(__SSE2__)
    auto* d = static_cast<char*>(dst);
    auto const* s = static_cast<char const*>(src);
    std::size_t const head = std::min(n, (64 - (reinterpret_cast<std::uintptr_t>(d) & 63)) & 63);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    std::size_t const body = n & ~std::size_t{63};
    for (std::size_t i = 0; i < body; i += 64) {
        // Four loads, then four stores: the loads of a line go out together.
        __m128i const a = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + i));
        __m128i const b = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + i + 16));
        __m128i const c = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + i + 32));
        __m128i const e = _mm_loadu_si128(reinterpret_cast<__m128i const*>(s + i + 48));
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();
    std::memcpy(d + body, s + body, n - body);
#else
    std::memcpy(dst, src, n);
#endif
}

// memcpy, streaming from `threshold` bytes on. n may be 0; the ranges may not overlap.
inline void copy_bytes(void* dst, void const* src, std::size_t n, std::size_t threshold) noexcept {
    if (n == 0) return;  // memcpy with a null pointer is undefined even for zero bytes
    if (n >= threshold) streaming_copy(dst, src, n);
    else std::memcpy(dst, src, n);
}

} // namespace detail

/// Ordinary host memory. Reductions are loops that the compiler vectorises (detail::reduce_block).
struct host_memory {
    /// Uninitialised scratch of `n` elements (never zero-filled: it is always overwritten).
    /// Large ones are reused from collective to collective (detail::scratch_cache).
    template <class T>
    class buffer {
        static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64);

    public:
        buffer() = default;
        explicit buffer(std::size_t n) : size_(n) {
            if (n) data_ = detail::scratch_cache::take(n * sizeof(T), capacity_);
        }
        buffer(buffer&& o) noexcept
            : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)), size_(std::exchange(o.size_, 0)) {}
        buffer& operator=(buffer&& o) noexcept {
            if (this != &o) {
                detail::scratch_cache::give(data_, capacity_);
                data_ = std::exchange(o.data_, nullptr);
                capacity_ = std::exchange(o.capacity_, 0);
                size_ = std::exchange(o.size_, 0);
            }
            return *this;
        }
        ~buffer() { detail::scratch_cache::give(data_, capacity_); }
        std::span<T> span() noexcept { return {reinterpret_cast<T*>(data_), size_}; }
        std::span<T const> span() const noexcept { return {reinterpret_cast<T const*>(data_), size_}; }
        std::size_t size() const noexcept { return size_; }

    private:
        std::byte* data_ = nullptr;
        std::size_t capacity_ = 0;
        std::size_t size_ = 0;
    };

    /// dst = src (same sizes; the ranges may not overlap). Large copies bypass the cache
    /// (detail::copy_bytes).
    template <class T>
    static void copy(std::span<T> dst, std::span<T const> src) noexcept {
        copy_part(dst, src, dst.size_bytes());
    }
    /// The same into part of a buffer of `whole` bytes (a collective's output, filled block by
    /// block): it bypasses the cache when the whole buffer is that large, whatever the part's
    /// size — whether a block's destination is still cached depends on the buffer it is part
    /// of, not on the block.
    template <class T>
    static void copy_part(std::span<T> dst, std::span<T const> src, std::size_t whole) noexcept {
        static_assert(std::is_trivially_copyable_v<T>);
        detail::copy_bytes(dst.data(), src.data(), src.size_bytes(), whole >= detail::nt_copy_bytes() ? 0 : ~std::size_t{0});
    }

    /// acc[i] = op(acc[i], in[i]), or op(in[i], acc[i]) when `in_first` (order matters for
    /// non-commutative operations: the left operand holds the lower ranks' contributions).
    template <class T, class Op>
    static void reduce(std::span<T> acc, std::span<T const> in, Op const& op, bool in_first) noexcept {
        // One loop per operand order: the flag is tested once, not per element (g++ -O2 does
        // not unswitch loops).
        if (in_first) reduce(acc, in, std::span<T const>(acc), op);
        else reduce(acc, std::span<T const>(acc), in, op);
    }

    /// out[i] = op(a[i], b[i]); `out` may be `a` or `b` itself (exact aliasing, never a
    /// partial overlap).
    template <class T, class Op>
    static void reduce(std::span<T> out, std::span<T const> a, std::span<T const> b, Op const& op) noexcept {
        T* const o = out.data();
        std::size_t const n = out.size();
        // Each case gets a kernel whose pointers are __restrict, so the compiler needs no
        // runtime overlap check (which g++ -O2 refuses to emit, see detail::reduce_block).
        if (a.data() == b.data()) detail::reduce_aliased(o, a.data(), b.data(), n, op);
        else if (o == a.data()) detail::reduce_into</*acc_first=*/true>(o, b.data(), n, op);
        else if (o == b.data()) detail::reduce_into</*acc_first=*/false>(o, a.data(), n, op);
        else detail::reduce_disjoint(o, a.data(), b.data(), n, op);
    }

    /// Applies the operation's final step (AVG divides by the rank count) to a result.
    template <class T, class Op>
    static void finalize(std::span<T> data, Op const& op, rank_t p) noexcept {
        if constexpr (has_finalize<Op, T>) {
            for (T& x : data) x = op.finalize(x, p);
        }
    }
};

namespace detail {
// An op of no particular meaning, to check a memory space's reduce and finalize signatures.
struct sample_op {
    template <class T>
    CHORUS_HOST_DEVICE T operator()(T const& a, T const&) const noexcept {
        return a;
    }
};
} // namespace detail

/// Where a transport's buffers live: the scratch the algorithms allocate there and the copies
/// and reductions they run on it (docs/concepts.md#memory_space). Models: host_memory,
/// cuda_device_memory (cuda_ipc.hpp). Its functions are templates over the element type and
/// the op; they are checked here on int and a sample op.
template <class M>
concept memory_space = std::movable<typename M::template buffer<int>> &&
                       std::constructible_from<typename M::template buffer<int>, std::size_t> &&
                       requires(typename M::template buffer<int>& b, std::span<int> out, std::span<int const> in,
                                detail::sample_op const& op, rank_t p) {
                           { b.span() } -> std::same_as<std::span<int>>;
                           { b.size() } -> std::same_as<std::size_t>;
                           M::copy(out, in);
                           M::reduce(out, in, op, true);
                           M::reduce(out, in, in, op);
                           M::finalize(out, op, p);
                       };

static_assert(memory_space<host_memory>);

} // namespace chorus
