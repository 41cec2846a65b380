// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// cuda_ipc_transport: ranks are processes of one node, each bound to a GPU (LOCAL_RANK modulo
// the device count, so several ranks may share one); message buffers are CUDA device memory.
// The same algorithm templates as over TCP run over it: `chorus::allreduce(tp, span, op)` with
// a std::span over device memory allocates its scratch stream-ordered (from a pool of its own)
// and reduces with the kernels below, because the transport's memory_space is
// cuda_device_memory.
//
// Messages move through per-peer FIFOs in the receiver's device memory, shared once with
// cudaIpcGetMemHandle / cudaIpcOpenMemHandle (the protocol: staged/protocol.hpp); the
// handles, chunk headers and credits travel over a tcp_transport, whose rendezvous
// (MASTER_ADDR/MASTER_PORT, chorusrun) sets the group up.
//
// Stream semantics. Every copy and kernel of chorus runs on cudaStreamPerThread, which
// synchronises with the legacy default stream: work a program issued there before a collective
// is complete before chorus reads the buffers, and work it issues there afterwards sees the
// results. A receive's wait returns once its data is in place; a collective may return with
// its last reduction still queued, as NCCL's do: synchronise (tp.synchronize(), a synchronous
// cudaMemcpy, or cudaStreamSynchronize(cudaStreamPerThread)) before reading results on the host
// or from a non-blocking stream.
//
// Compile this header with nvcc (it defines kernels), -std=c++20; link CUDA::cudart and the
// TCP engine compiled once (target chorus::cuda_ipc does both, with
// CHORUS_TCP_SEPARATE_COMPILATION so that Asio never reaches nvcc). range-v3 is not used by any
// chorus header, so none reaches a .cu file.

#if !defined(__CUDACC__)
#error "<chorus/transport/cuda_ipc.hpp> defines CUDA kernels: compile this file with nvcc (a .cu file)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/config.hpp>
#include <chorus/detail/env.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/cuda_types.hpp>
#include <chorus/reduce/traits.hpp>
#include <chorus/transport/staged.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {

namespace detail {

/// Throws device_error naming the call and the CUDA error string unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, char const* call) {
    if (e != cudaSuccess)
        throw device_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// The stream of all of chorus's device work (see the header comment).
inline cudaStream_t cuda_stream() noexcept { return cudaStreamPerThread; }

// Grid-stride elementwise kernels: one launch covers any n; 256 threads per block, and at
// most 65535 * 8 blocks' worth of grid (each thread then loops).
inline constexpr unsigned cuda_block = 256;
inline unsigned cuda_grid(std::size_t n) noexcept {
    std::size_t const blocks = (n + cuda_block - 1) / cuda_block;
    return static_cast<unsigned>(blocks < 65535u * 8u ? (blocks ? blocks : 1) : 65535u * 8u);
}

template <class T, class Op>
__global__ void cuda_reduce_kernel(T* out, T const* a, T const* b, std::size_t n, Op op) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
        out[i] = static_cast<T>(op(a[i], b[i]));
}

template <class T, class Op>
__global__ void cuda_finalize_kernel(T* data, std::size_t n, Op op, rank_t p) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
        data[i] = static_cast<T>(op.finalize(data[i], p));
}

// Scratch and staging come from a pool of chorus's own per device, stream-ordered
// (cudaMallocFromPoolAsync), that keeps what it was given back: the default pool returns its
// memory to the device at every synchronisation (release threshold 0), so each collective
// after a cudaStreamSynchronize would map its scratch again. Chorus's pool holds at most its
// peak scratch (about the largest message), as NCCL holds its buffers; the program's own
// cudaMallocAsync pool is left as it is.
inline cudaMemPool_t cuda_scratch_pool() {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    static std::mutex m;
    static std::vector<cudaMemPool_t> pools;  // by device ordinal; live as long as the process
    std::lock_guard lock(m);
    if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(static_cast<std::size_t>(device) + 1, nullptr);
    cudaMemPool_t& pool = pools[static_cast<std::size_t>(device)];
    if (!pool) {
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        cudaMemPool_t created = nullptr;
        cuda_check(cudaMemPoolCreate(&created, &props), "cudaMemPoolCreate (chorus scratch)");
        auto keep = std::numeric_limits<std::uint64_t>::max();
        if (cudaError_t const e = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep); e != cudaSuccess) {
            (void)cudaMemPoolDestroy(created);
            cuda_check(e, "cudaMemPoolSetAttribute (chorus scratch)");
        }
        pool = created;
    }
    return pool;
}

inline void* cuda_scratch_allocate(std::size_t bytes, char const* what) {
    void* p = nullptr;
    cuda_check(cudaMallocFromPoolAsync(&p, bytes, cuda_scratch_pool(), cuda_stream()), what);
    return p;
}

} // namespace detail

/// CUDA device memory of the current device. Scratch comes from a stream-ordered pool
/// (cudaMallocFromPoolAsync: no device-wide synchronisation per collective); reductions are
/// kernels on chorus's stream, so an operation's `operator()` must be CHORUS_HOST_DEVICE (all
/// the built-in ones are).
struct cuda_device_memory {
    template <class T>
    class buffer {
    public:
        buffer() = default;
        explicit buffer(std::size_t n) : size_(n) {
            if (n) data_ = static_cast<T*>(detail::cuda_scratch_allocate(n * sizeof(T), "cudaMallocFromPoolAsync (chorus scratch)"));
        }
        buffer(buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
        buffer& operator=(buffer&& o) noexcept {
            std::swap(data_, o.data_);
            std::swap(size_, o.size_);
            return *this;
        }
        ~buffer() {
            if (data_) (void)cudaFreeAsync(data_, detail::cuda_stream());  // stream-ordered: after its last use
        }
        std::span<T> span() noexcept { return {data_, size_}; }
        std::size_t size() const noexcept { return size_; }

    private:
        T* data_ = nullptr;
        std::size_t size_ = 0;
    };

    template <class T>
    static void copy(std::span<T> dst, std::span<T const> src) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (src.empty()) return;
        detail::cuda_check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault, detail::cuda_stream()),
                           "cudaMemcpyAsync (chorus copy)");
    }

    /// acc[i] = op(acc[i], in[i]), or op(in[i], acc[i]) when `in_first`.
    template <class T, class Op>
    static void reduce(std::span<T> acc, std::span<T const> in, Op const& op, bool in_first) {
        if (in_first) reduce(acc, in, std::span<T const>(acc), op);
        else reduce(acc, std::span<T const>(acc), in, op);
    }

    /// out[i] = op(a[i], b[i]); `out` may be `a` or `b` (elementwise, so aliasing is safe).
    template <class T, class Op>
    static void reduce(std::span<T> out, std::span<T const> a, std::span<T const> b, Op const& op) {
        std::size_t const n = out.size();
        if (n == 0) return;
        detail::cuda_reduce_kernel<<<detail::cuda_grid(n), detail::cuda_block, 0, detail::cuda_stream()>>>(out.data(), a.data(),
                                                                                                         b.data(), n, op);
        detail::cuda_check(cudaGetLastError(), "chorus reduction kernel launch");
    }

    template <class T, class Op>
    static void finalize(std::span<T> data, Op const& op, rank_t p) {
        if constexpr (has_finalize<Op, T>) {
            if (data.empty()) return;
            detail::cuda_finalize_kernel<<<detail::cuda_grid(data.size()), detail::cuda_block, 0, detail::cuda_stream()>>>(
                data.data(), data.size(), op, p);
            detail::cuda_check(cudaGetLastError(), "chorus finalize kernel launch");
        }
    }

    /// Waits for all of chorus's queued device work.
    static void synchronize() { detail::cuda_check(cudaStreamSynchronize(detail::cuda_stream()), "cudaStreamSynchronize"); }
};

namespace detail {

/// staged_engine's Device for CUDA IPC: FIFOs from cudaMalloc (exportable), copies with
/// cudaMemcpyAsync on chorus's stream, completion by events from a pool.
class cuda_ipc_device {
public:
    using memory_space = cuda_device_memory;
    using handle = cudaIpcMemHandle_t;
    using event = cudaEvent_t;

    explicit cuda_ipc_device(int ordinal) : ordinal_(ordinal) { cuda_check(cudaSetDevice(ordinal), "cudaSetDevice"); }
    cuda_ipc_device(cuda_ipc_device&& o) noexcept : ordinal_(o.ordinal_), pool_(std::move(o.pool_)) { o.pool_.clear(); }
    cuda_ipc_device& operator=(cuda_ipc_device&&) = delete;
    ~cuda_ipc_device() {
        for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
    }

    int ordinal() const noexcept { return ordinal_; }

    void* allocate_shared(std::size_t bytes) {
        void* p = nullptr;
        cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc (chorus FIFO)");
        return p;
    }
    void release_shared(void* p) noexcept { (void)cudaFree(p); }
    // Freeing a region another process still has open is undefined (CUDA IPC's rule), and
    // peers that did not say goodbye may: it stays allocated until this process exits.
    void abandon_shared(void*) noexcept {}
    // The transport's device made current for a scope (its destructor, which may run on any
    // thread), and the thread's own restored after it.
    class current_scope {
    public:
        explicit current_scope(int ordinal) noexcept {
            if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != ordinal) (void)cudaSetDevice(ordinal);
            else previous_ = -1;
        }
        current_scope(current_scope const&) = delete;
        current_scope& operator=(current_scope const&) = delete;
        ~current_scope() {
            if (previous_ >= 0) (void)cudaSetDevice(previous_);
        }

    private:
        int previous_ = -1;
    };
    current_scope scoped_current() const noexcept { return current_scope(ordinal_); }

    void check_current() const {
        int current = -1;
        cuda_check(cudaGetDevice(&current), "cudaGetDevice");
        if (current != ordinal_)
            throw invalid_argument("cuda_ipc_transport: this thread's current CUDA device is " + std::to_string(current) +
                                   ", the transport's is " + std::to_string(ordinal_) + ": call cudaSetDevice(" +
                                   std::to_string(ordinal_) + ") in this thread first (the constructor sets it only in its own)");
    }
    // Staging for messages that arrive before their receive: stream-ordered, like scratch.
    void* allocate(std::size_t bytes) { return cuda_scratch_allocate(bytes ? bytes : 1, "cudaMallocFromPoolAsync (chorus staging)"); }
    void release(void* p) noexcept { (void)cudaFreeAsync(p, cuda_stream()); }

    handle export_handle(void* base) {
        handle h{};
        cuda_check(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle");
        return h;
    }
    void* open_handle(handle const& h) {
        void* p = nullptr;
        cuda_check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
        return p;
    }
    void close_handle(void* p) noexcept { (void)cudaIpcCloseMemHandle(p); }

    void copy(void* dst, void const* src, std::size_t bytes) {
        cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()), "cudaMemcpyAsync (chorus chunk)");
    }
    event record() {
        cudaEvent_t e = nullptr;
        if (pool_.empty()) {
            cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        } else {
            e = pool_.back();
            pool_.pop_back();
        }
        if (cudaError_t const r = cudaEventRecord(e, cuda_stream()); r != cudaSuccess) {
            pool_.push_back(e);
            cuda_check(r, "cudaEventRecord");
        }
        return e;
    }
    bool done(event& e) {
        cudaError_t const r = cudaEventQuery(e);
        if (r == cudaErrorNotReady) return false;
        cuda_check(r, "cudaEventQuery");
        return true;
    }
    void release(event& e) noexcept {
        try {
            pool_.push_back(e);
        } catch (...) {
            (void)cudaEventDestroy(e);
        }
    }
    void synchronize() noexcept { (void)cudaStreamSynchronize(cuda_stream()); }

private:
    int ordinal_;
    std::vector<cudaEvent_t> pool_;
};

/// The GPU of a rank: `requested` if not negative, else local_rank modulo the device count.
inline int cuda_pick_device(int requested, rank_t local_rank) {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (count <= 0) throw device_error("cuda_ipc_transport: no CUDA device");
    if (requested >= count)
        throw invalid_argument("cuda_ipc_transport: device " + std::to_string(requested) + " requested, but only " +
                               std::to_string(count) + " are visible");
    return requested >= 0 ? requested : static_cast<int>(local_rank % count);
}

} // namespace detail

struct cuda_ipc_options {
    /// The GPU; -1: the control channel's local_rank() modulo the device count.
    int device = -1;
    /// FIFO slot size and slots per peer: each rank holds size() * slots * chunk bytes of FIFOs.
    /// Larger chunks amortise the control message per chunk; more slots keep more of a
    /// message in flight.
    std::size_t chunk = std::size_t{4} << 20;
    std::size_t slots = 4;
};

struct cuda_ipc_config {
    /// The control channel: rendezvous, FIFO handles, chunk headers and credits.
    tcp_config control;
    cuda_ipc_options options;
};

/// One rank of a CUDA IPC group. Move-only; one thread drives it, with the transport's device
/// current (the constructor makes it current in its thread; another thread must call
/// cudaSetDevice(tp.device_ordinal()) first, or its operations throw invalid_argument and
/// fail the group). A CUDA error in an operation fails the group too, its text reaching every
/// rank, as any other failure does.
class cuda_ipc_transport : public staged_transport<detail::cuda_ipc_device, tcp_transport> {
    using base = staged_transport<detail::cuda_ipc_device, tcp_transport>;

public:
    /// Connects the control channel (the rendezvous of tcp_transport), picks the GPU and
    /// shares the FIFOs.
    explicit cuda_ipc_transport(cuda_ipc_config config) : cuda_ipc_transport(tcp_transport(std::move(config.control)), config.options) {}

    /// Over an existing tcp_transport as the control channel (it must have no messages in
    /// flight), e.g. one a program already used for host data: no second rendezvous.
    explicit cuda_ipc_transport(tcp_transport&& control, cuda_ipc_options options = {})
        : base(std::move(control), staged_config{options.chunk, options.slots},
               detail::cuda_ipc_device(detail::cuda_pick_device(options.device, control.local_rank()))) {}

    /// The options from CHORUS_CUDA_DEVICE, CHORUS_CUDA_CHUNK_BYTES and CHORUS_CUDA_SLOTS.
    static cuda_ipc_options options_from_env() {
        detail::env_reader const env("cuda_ipc_transport::from_env");
        cuda_ipc_options o;
        o.device = static_cast<int>(env.number_at_least("CHORUS_CUDA_DEVICE", 0, o.device));
        o.chunk = static_cast<std::size_t>(env.number_at_least("CHORUS_CUDA_CHUNK_BYTES", 1, static_cast<long long>(o.chunk)));
        o.slots = static_cast<std::size_t>(env.number_at_least("CHORUS_CUDA_SLOTS", 1, static_cast<long long>(o.slots)));
        return o;
    }
    /// The launcher's variables (tcp_config_from_env) and options_from_env(); errors name
    /// cuda_ipc_transport::from_env.
    static cuda_ipc_config config_from_env() {
        return {tcp_config_from_env("cuda_ipc_transport::from_env"), options_from_env()};
    }
    static cuda_ipc_transport from_env() { return cuda_ipc_transport(config_from_env()); }

    /// Ring allreduce segments (detail::ring_segment_elements): each message costs a control
    /// round trip of tens of microseconds while a 256 KiB device copy takes a few, so the
    /// ring's messages are as large as the default FIFO chunk.
    static constexpr std::size_t ring_segment_bytes = std::size_t{4} << 20;

    /// The CUDA device ordinal this rank uses.
    int device_ordinal() noexcept { return device().ordinal(); }
    /// Waits for all of chorus's queued device work (the last reduction of a collective).
    void synchronize() { cuda_device_memory::synchronize(); }
};

} // namespace chorus
