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
// handles, chunk headers and credits travel over a shm_transport (the ranks share one node),
// whose ranks meet once over tcp_transport's rendezvous (MASTER_ADDR/MASTER_PORT, chorusrun):
// a control message then costs about a microsecond, not the tens of a loopback TCP round
// trip, and a peer that dies is named within milliseconds. Small collectives take one_shot
// rounds instead (it is a direct_transport): a block copied once into a slot of the rank's own
// memory, read by the peers in place and folded in one kernel (cuda_device_memory::fold).
//
// Stream semantics. Every copy and kernel of chorus runs on cudaStreamPerThread, which
// synchronises with the legacy default stream, or on the stream of a cuda_stream_guard: work a
// program issued there before a collective is complete before chorus reads the buffers, and
// work it issues there afterwards sees the results. A receive's wait returns once its data is in place; a collective may return with
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

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#include <chorus/config.hpp>
#include <chorus/detail/elementwise.hpp>
#include <chorus/detail/env.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/reduce/cuda_types.hpp>
#include <chorus/reduce/traits.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/signals.hpp>
#include <chorus/transport/staged.hpp>
#include <chorus/transport/tcp.hpp>

namespace chorus {

namespace detail {

/// Throws device_error naming the call and the CUDA error string unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, char const* call) {
    if (e != cudaSuccess)
        throw device_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// The stream of all of chorus's device work in this thread: cudaStreamPerThread unless a
// cuda_stream_guard says otherwise (see the header comment).
inline cudaStream_t& cuda_current_stream() noexcept {
    thread_local cudaStream_t stream = cudaStreamPerThread;
    return stream;
}
inline cudaStream_t cuda_stream() noexcept { return cuda_current_stream(); }

// Grid-stride elementwise kernels: one launch covers any n; 256 threads per block, and at
// most 65535 * 8 blocks' worth of grid (each thread then loops).
inline constexpr unsigned cuda_block = 256;
inline unsigned cuda_grid(std::size_t n) noexcept {
    std::size_t const blocks = (n + cuda_block - 1) / cuda_block;
    return static_cast<unsigned>(blocks < 65535u * 8u ? (blocks ? blocks : 1) : 65535u * 8u);
}

// The operands of one elementwise pass (reduce: two; fold: this rank's block and its peers'
// slots, read where they lie, IPC-mapped; finish: one), a kernel argument.
inline constexpr std::size_t cuda_max_fold = 16;
template <class T>
struct cuda_fold_parts {
    T const* part[cuda_max_fold];
    unsigned count;
};

// The 16-bit types are why the passes go 16 bytes at a time: they must take the wide path.
static_assert(widens_v<__half> && widens_v<__nv_bfloat16> && widens_v<float> && widens_v<double>);

// out[i] = finish(parts[0][i] step ... step parts[count-1][i]), 16 bytes per operand per load
// where the operands line up (detail/elementwise.hpp). __grid_constant__: the pass indexes the
// operands' array, which is then read where the launch put it instead of copied per thread.
// split_wide runs on the host too, to size the grid by the split's work items.
template <class T, class Step, class Finish>
__global__ void cuda_elementwise_kernel(T* out, __grid_constant__ cuda_fold_parts<T> const parts, std::size_t n, Step const step,
                                        Finish const finish) {
    fold_elements(out, operand_array<T>{parts.part}, parts.count, n, blockIdx.x * std::size_t{blockDim.x} + threadIdx.x,
                  std::size_t{gridDim.x} * blockDim.x, step, finish);
}

template <class T, class Step, class Finish>
void cuda_elementwise(T* out, cuda_fold_parts<T> const& parts, std::size_t n, Step const& step, Finish const& finish, char const* what) {
    wide_split const s = split_wide(out, operand_array<T>{parts.part}, parts.count, n);
    cuda_elementwise_kernel<<<cuda_grid(wide_items<T>(s, n)), cuda_block, 0, cuda_stream()>>>(out, parts, n, step, finish);
    cuda_check(cudaGetLastError(), what);
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

// Signaled launches (signals.hpp) on a GPU: a lane is a block, its threads a block's. The
// flags are system-scope atomics (a peer's pad is another process's memory, or another GPU's);
// the lane counter and the failure claim are this device's own. Reads of the peers' slots skip
// L1 (__ldcg): a peer wrote them during this launch, after a launch that may have cached them.
inline constexpr unsigned cuda_signal_threads = 512;
struct cuda_signal_sync {
    using system_ref = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>;
    using device_ref = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>;
    __device__ unsigned lane() const { return blockIdx.x; }
    __device__ unsigned lanes() const { return gridDim.x; }
    __device__ unsigned thread() const { return threadIdx.x; }
    __device__ unsigned threads() const { return blockDim.x; }
    __device__ void lane_sync() const { __syncthreads(); }
    __device__ void fence_system() const { __threadfence_system(); }
    __device__ std::uint64_t load_acquire(std::uint64_t& w) const { return system_ref(w).load(cuda::memory_order_acquire); }
    __device__ std::uint64_t load_relaxed(std::uint64_t& w) const { return system_ref(w).load(cuda::memory_order_relaxed); }
    __device__ void store_release(std::uint64_t& w, std::uint64_t v) const { system_ref(w).store(v, cuda::memory_order_release); }
    __device__ void store_relaxed(std::uint64_t& w, std::uint64_t v) const { system_ref(w).store(v, cuda::memory_order_relaxed); }
    __device__ std::uint64_t add_device(std::uint64_t& w) const { return device_ref(w).fetch_add(1, cuda::memory_order_acq_rel); }
    __device__ bool claim(std::uint64_t& w) const {
        std::uint64_t expected = 0;
        return device_ref(w).compare_exchange_strong(expected, 1, cuda::memory_order_acq_rel);
    }
    // The status lies in host memory, where a GPU need not do atomic read-modify-writes: a store.
    __device__ void publish(std::uint32_t& w, std::uint32_t v) const {
        cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(w).store(v, cuda::memory_order_release);
    }
    __device__ std::uint64_t now_ns() const {
        std::uint64_t t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    }
    __device__ void pause() const {}
    template <class T>
    __device__ T load(T const* p) const {
        if constexpr (sizeof(T) == 8 && alignof(T) == 8) return bits_as<T>(__ldcg(reinterpret_cast<unsigned long long const*>(p)));
        else if constexpr (sizeof(T) == 4 && alignof(T) == 4) return bits_as<T>(__ldcg(reinterpret_cast<unsigned const*>(p)));
        else if constexpr (sizeof(T) == 2 && alignof(T) == 2) return bits_as<T>(__ldcg(reinterpret_cast<unsigned short const*>(p)));
        else if constexpr (sizeof(T) == 1) return bits_as<T>(__ldcg(reinterpret_cast<unsigned char const*>(p)));
        else if constexpr (sizeof(T) == 16 && alignof(T) == 16) return bits_as<T>(__ldcg(reinterpret_cast<uint4 const*>(p)));
        else return *p;  // other sizes and alignments: through L1, which a launch before may have filled
    }
    template <class T>
    __device__ wide_vector<T> load_wide(T const* p) const {
        return bits_as<wide_vector<T>>(__ldcg(reinterpret_cast<uint4 const*>(p)));
    }
    template <class T, class U>
    __device__ static T bits_as(U u) {
        T t;
        memcpy(&t, &u, sizeof t);
        return t;
    }
};

template <class Body>
__global__ void __launch_bounds__(cuda_signal_threads) cuda_signaled_kernel(__grid_constant__ signal_args const a, Body const body) {
    __shared__ signal_lane_state state;
    signal_channel<cuda_signal_sync> c(a, state, cuda_signal_sync{});
    c.begin();
    body(c);
    c.finish();
}

// Whether MPS runs this machine's GPUs (its control pipe exists: CUDA_MPS_PIPE_DIRECTORY,
// default /tmp/nvidia-mps); `pipe` gets the directory. A pipe left by a daemon that died reads
// as on: CHORUS_CUDA_SIGNALS=0 then says otherwise.
inline bool cuda_mps_on(std::string& pipe) {
    pipe = env_reader::get({"CUDA_MPS_PIPE_DIRECTORY"});
    if (pipe.empty()) pipe = "/tmp/nvidia-mps";
    return ::access((pipe + "/control").c_str(), F_OK) == 0;
}

} // namespace detail

/// Puts chorus's device work in this thread on `stream` while it lives, as NCCL's calls take a
/// stream: what the program queued on `stream` before a collective is complete before chorus
/// reads the buffers, and what it queues there afterwards sees the results (a collective may
/// return with its last kernel queued, as without a guard). Guards nest; the default stream is
/// cudaStreamPerThread. A collective cannot be captured into a CUDA graph (its host waits for
/// device copies): called on a capturing stream it throws invalid_argument and fails the group,
/// leaving the capture intact. Destroy a stream only once a later collective ran on another
/// stream (which waits for the first's chorus work), or after synchronising it.
class cuda_stream_guard {
public:
    explicit cuda_stream_guard(cudaStream_t stream) noexcept : previous_(std::exchange(detail::cuda_current_stream(), stream)) {}
    cuda_stream_guard(cuda_stream_guard const&) = delete;
    cuda_stream_guard& operator=(cuda_stream_guard const&) = delete;
    ~cuda_stream_guard() { detail::cuda_current_stream() = previous_; }

private:
    cudaStream_t previous_;
};

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
        if (out.empty()) return;
        detail::cuda_fold_parts<T> args{{a.data(), b.data()}, 2};
        detail::cuda_elementwise(out.data(), args, out.size(), op, detail::keep_value{}, "chorus reduction kernel launch");
    }

    /// out[i] = parts[0][i] op ... op parts[k-1][i], then the op's finish, in one kernel (the
    /// one_shot collectives' fold over the peers' slots); 2 <= k <= max_fold.
    static constexpr std::size_t max_fold = detail::cuda_max_fold;
    template <class T, class Op>
    static void fold(std::span<T> out, std::span<T const* const> parts, Op const& op, rank_t p) {
        if (parts.size() < 2 || parts.size() > max_fold)
            throw invalid_argument("cuda_device_memory::fold: " + std::to_string(parts.size()) + " operands, not 2 to " +
                                   std::to_string(max_fold));
        if (out.empty()) return;
        detail::cuda_fold_parts<T> args{};
        for (std::size_t r = 0; r < parts.size(); ++r) args.part[r] = parts[r];
        args.count = static_cast<unsigned>(parts.size());
        detail::cuda_elementwise(out.data(), args, out.size(), op, detail::op_finish<Op>{op, p}, "chorus fold kernel launch");
    }

    template <class T, class Op>
    static void finalize(std::span<T> data, Op const& op, rank_t p) {
        if constexpr (has_finalize<Op, T>) {
            if (data.empty()) return;
            detail::cuda_fold_parts<T> args{{data.data()}, 1};
            detail::cuda_elementwise(data.data(), args, data.size(), detail::keep_value{}, detail::op_finish<Op>{op, p},
                                     "chorus finalize kernel launch");
        }
    }

    /// Waits for all of chorus's queued device work.
    static void synchronize() { detail::cuda_check(cudaStreamSynchronize(detail::cuda_stream()), "cudaStreamSynchronize"); }
};

namespace detail {

// The driver's cuMemGetAddressRange (the allocation holding an address), looked up once through
// the runtime: the runtime API has no such query, and linking the driver library would add a
// dependency to every program that includes chorus. nullptr where the driver lacks it.
using cuda_address_range_fn = int (*)(unsigned long long* base, std::size_t* size, unsigned long long address);
inline cuda_address_range_fn cuda_address_range() noexcept {
    static cuda_address_range_fn const fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
        cudaError_t const e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &found);
#else
        cudaError_t const e = cudaGetDriverEntryPoint("cuMemGetAddressRange", &f, cudaEnableDefault, &found);
#endif
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return cuda_address_range_fn{};
        }
        return reinterpret_cast<cuda_address_range_fn>(f);
    }();
    return fn;
}

/// staged_engine's Device for CUDA IPC: FIFOs from cudaMalloc (exportable), copies with
/// cudaMemcpyAsync on chorus's stream, completion by events from a pool.
class cuda_ipc_device {
public:
    using memory_space = cuda_device_memory;
    using handle = cudaIpcMemHandle_t;
    using event = cudaEvent_t;

    explicit cuda_ipc_device(int ordinal) : ordinal_(ordinal) { cuda_check(cudaSetDevice(ordinal), "cudaSetDevice"); }
    cuda_ipc_device(cuda_ipc_device&& o) noexcept
        : ordinal_(o.ordinal_), pool_(std::move(o.pool_)), last_stream_(o.last_stream_), handoff_(std::exchange(o.handoff_, nullptr)),
          status_(std::exchange(o.status_, nullptr)), side_(std::exchange(o.side_, nullptr)) {
        o.pool_.clear();
    }
    cuda_ipc_device& operator=(cuda_ipc_device&&) = delete;
    ~cuda_ipc_device() {
        for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
        if (handoff_) (void)cudaEventDestroy(handoff_);
        if (status_) (void)cudaFreeHost(status_);  // the engine synchronised the device before
        if (side_) (void)cudaStreamDestroy(side_);
    }

    /// A signaled launch (signals.hpp): `lanes` blocks of cuda_signal_threads on chorus's stream.
    /// Inside a capture it follows no earlier stream (an event of another stream cannot be
    /// waited for there): capture on the stream the group's work went to, or after synchronising,
    /// and replay the graph on the stream of the group's other calls (two launches of one rank
    /// must never run at once: they share its slots and counters).
    template <class Body>
    void launch(signal_args const& a, unsigned lanes, Body const& body, signal_poll) {
        static_assert(std::is_trivially_copyable_v<Body>, "a signaled launch's body is a kernel argument");
        if (!capturing()) follow_stream();
        cuda_signaled_kernel<<<lanes, cuda_signal_threads, 0, cuda_stream()>>>(a, body);
        cuda_check(cudaGetLastError(), "chorus signaled kernel launch");
    }
    /// Where this rank's kernels publish their first failure: pinned host memory the device
    /// writes (mapped; one address for both under unified addressing).
    /// Stores `value` into device memory (a pad's abort word, this rank's or a peer's through
    /// its mapping) now, on a stream of its own: a kernel spinning on chorus's stream sees it.
    void raise(std::uint64_t* word, std::uint64_t value) noexcept {
        [[maybe_unused]] auto const current = scoped_current();  // a failure on a thread whose device is another
        // A failure raised while this thread captures a graph (a collective refused inside a
        // capture) must leave the program's capture valid: in the default (global) mode a copy
        // from pageable memory counts as unsafe there and would invalidate it. Relaxed mode for
        // this thread while the copy runs on a stream of its own, as NCCL's side-stream work does.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        bool const swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
        if (!side_ && cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking) != cudaSuccess) side_ = nullptr;
        // From pageable memory the copy is staged before the call returns; the wait is for it alone.
        if (side_ && cudaMemcpyAsync(word, &value, sizeof value, cudaMemcpyHostToDevice, side_) == cudaSuccess)
            (void)cudaStreamSynchronize(side_);
        if (swapped) (void)cudaThreadExchangeStreamCaptureMode(&mode);  // back to the thread's own mode
        (void)cudaGetLastError();
    }
    /// Whether chorus's stream is being captured into a CUDA graph.
    bool capturing() const {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        cuda_check(cudaStreamIsCapturing(cuda_stream(), &capture), "cudaStreamIsCapturing");
        return capture != cudaStreamCaptureStatusNone;
    }
    signal_status* failure_status() {
        if (!status_) {
            void* p = nullptr;
            cuda_check(cudaHostAlloc(&p, sizeof(signal_status), cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc (chorus status)");
            status_ = static_cast<signal_status*>(p);
            *status_ = {};
            // raise()'s stream, made now (at set-up) rather than while a failure unwinds.
            if (cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking) != cudaSuccess) side_ = nullptr;
        }
        return status_;
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

    void check_current(bool capturing = false) const {
        int current = -1;
        cuda_check(cudaGetDevice(&current), "cudaGetDevice");
        if (current != ordinal_)
            throw invalid_argument("cuda_ipc_transport: this thread's current CUDA device is " + std::to_string(current) +
                                   ", the transport's is " + std::to_string(ordinal_) + ": call cudaSetDevice(" +
                                   std::to_string(ordinal_) + ") in this thread first (the constructor sets it only in its own)");
        if (capturing) return;  // a signaled launch: the host waits for nothing
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        cuda_check(cudaStreamIsCapturing(cuda_stream(), &capture), "cudaStreamIsCapturing");
        if (capture != cudaStreamCaptureStatusNone)
            throw invalid_argument("cuda_ipc_transport: the stream is being captured into a CUDA graph; this collective waits on "
                                   "the host for device copies and cannot be captured (only the one_shot allreduce, broadcast, "
                                   "allgather, reduce_scatter and alltoall of up to direct_bytes, signaled launches, can): "
                                   "call it outside the capture");
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

    /// The handle of the cudaMalloc allocation holding [p, p + n), and p's offset in it
    /// (exposing_transport: two_shot reads the caller's buffer in place); std::nullopt for
    /// memory CUDA IPC cannot share — host, managed or another device's memory, stream-ordered
    /// pools (cudaMallocAsync), virtual memory (cuMemCreate), a mapping of another process's —
    /// where the collective then takes another algorithm on every rank.
    struct exported {
        cudaIpcMemHandle_t handle;
        std::size_t offset;
    };
    std::optional<exported> export_range(void const* p, std::size_t n) {
        cudaPointerAttributes attributes{};
        if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
            (void)cudaGetLastError();  // its own error, not sticky: cleared, so that later calls do not report it
            return std::nullopt;
        }
        if (attributes.type != cudaMemoryTypeDevice || attributes.device != ordinal_) return std::nullopt;
        auto const range = detail::cuda_address_range();
        unsigned long long base = 0;
        std::size_t size = 0;
        auto const at = reinterpret_cast<unsigned long long>(p);
        if (range == nullptr || range(&base, &size, at) != 0 || at + n > base + size) return std::nullopt;
        exported x{};
        if (cudaIpcGetMemHandle(&x.handle, reinterpret_cast<void*>(base)) != cudaSuccess) {
            (void)cudaGetLastError();
            return std::nullopt;
        }
        x.offset = static_cast<std::size_t>(at - base);
        return x;
    }

    void copy(void* dst, void const* src, std::size_t bytes) {
        follow_stream();
        cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()), "cudaMemcpyAsync (chorus chunk)");
    }
    event record() {
        follow_stream();
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
    // Every stream of the device, not only this thread's: the destructor may run on another
    // thread than the one whose queued kernels still read the peers' slots (one_shot). Not
    // while the stream is being captured (a failing collective inside a capture): synchronising
    // would invalidate the program's capture, and nothing of chorus's was queued in it.
    void synchronize() noexcept {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cuda_stream(), &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) return;
        (void)cudaDeviceSynchronize();
    }

private:
    // The transport's device work on a stream other than its previous one (a cuda_stream_guard
    // began or ended) first waits for what it queued on that one: an event completing on the
    // new stream then covers the old one's work too — the one_shot rounds' ordering (a slot is
    // written only after this rank's reads of its last round) holds across streams. (Another
    // thread's cudaStreamPerThread is not this thread's: see cuda_ipc_transport.)
    void follow_stream() {
        cudaStream_t const now = cuda_stream();
        if (now == last_stream_) return;
        if (!handoff_) cuda_check(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        cuda_check(cudaEventRecord(handoff_, last_stream_), "cudaEventRecord (chorus stream handoff)");
        cuda_check(cudaStreamWaitEvent(now, handoff_, 0), "cudaStreamWaitEvent (chorus stream handoff)");
        last_stream_ = now;
    }

    int ordinal_;
    std::vector<cudaEvent_t> pool_;
    cudaStream_t last_stream_ = cudaStreamPerThread;
    cudaEvent_t handoff_ = nullptr;
    signal_status* status_ = nullptr;
    cudaStream_t side_ = nullptr;  // raise()'s
};

/// The control channel's shared memory: rings of 64 KiB (a control record is one of 128
/// bytes), no direct slots (the one_shot blocks are in device memory), `timeout`.
inline shm_config cuda_control_memory(std::chrono::milliseconds timeout = shm_config{}.timeout) {
    shm_config c;
    c.ring_bytes = std::size_t{64} << 10;
    c.direct_bytes = 0;
    c.timeout = timeout;
    return c;
}

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
    /// The largest block of a one_shot round (two slots of it per rank, behind the FIFOs): a
    /// collective whose block fits takes one copy into this rank's slot and one control record
    /// per peer, the peers reading the slot in place and folding in one kernel; 0: none.
    /// Not yet measured on a GPU: see docs/algorithms.md#one_shot-over-cuda-ipc.
    std::size_t direct_bytes = std::size_t{1} << 20;
    /// Messages to another rank of at least this many bytes, in memory CUDA IPC shares
    /// (cudaMalloc), go by rendezvous: the receiver opens the sender's allocation and copies
    /// the message once, into its receive buffer, where the FIFO takes two copies and a control
    /// message each way per chunk (staged/protocol.hpp). Each costs an IPC open and close unless
    /// the buffer is registered (chorus::register_buffer); the default, the depth of the default
    /// FIFO (4 slots x 4 MiB), leaves the ring's 4 MiB messages to the FIFO. 0: never. Not yet
    /// measured on a GPU (cuda_bench --ops sendrecv names the way each row took).
    std::size_t rendezvous_bytes = std::size_t{16} << 20;
    /// Signaled launches: a one_shot allreduce, broadcast, allgather, reduce_scatter or
    /// alltoall of up to direct_bytes runs as one kernel per rank, the ranks synchronising
    /// through flags in each other's memory (no host round trip; it can be captured into a
    /// CUDA graph). 1: on, 0: off, -1: on where the ranks' kernels run at
    /// once — under MPS, or with a GPU per rank — and off where they are time-sliced (ranks
    /// sharing a GPU without MPS, where a kernel that waits for a peer's holds the GPU until its
    /// time slice ends). Used only where every rank has it on.
    int signals = -1;
};

struct cuda_ipc_config {
    /// The rendezvous, over TCP; its timeout bounds every wait of the transport.
    tcp_config control;
    cuda_ipc_options options;
    /// The control channel's shared memory (FIFO handles, chunk headers, credits, one_shot
    /// records); its timeout is control's.
    shm_config control_memory = detail::cuda_control_memory();
};

/// One rank of a CUDA IPC group. Move-only; one thread drives it, with the transport's device
/// current (the constructor makes it current in its thread; another thread must call
/// cudaSetDevice(tp.device_ordinal()) first, or its operations throw invalid_argument and
/// fail the group). Its work goes to the driving thread's cudaStreamPerThread: a thread that
/// takes over from another calls tp.synchronize() in the other first, so that the one_shot
/// rounds' ordering (a round's copy after the previous round's reads) holds across them. A CUDA error in an operation fails the group too, its text reaching every
/// rank, as any other failure does.
class cuda_ipc_transport : public staged_transport<detail::cuda_ipc_device, shm_transport> {
    using base = staged_transport<detail::cuda_ipc_device, shm_transport>;

public:
    /// Meets the other ranks (the rendezvous of tcp_transport), joins them in shared memory
    /// for the control channel, picks the GPU and shares the FIFOs.
    explicit cuda_ipc_transport(cuda_ipc_config config)
        : cuda_ipc_transport(tcp_transport(std::move(config.control)), config.options, config.control_memory) {}

    /// Over an existing tcp_transport (it must have no messages in flight), e.g. one a program
    /// already used for host data: no second rendezvous. The ranks meet over it, then leave it
    /// (it is moved from) for a control channel in shared memory whose timeout is its.
    explicit cuda_ipc_transport(tcp_transport&& bootstrap, cuda_ipc_options options = {},
                                shm_config control_memory = detail::cuda_control_memory())
        : cuda_ipc_transport(shm_transport::over(std::move(bootstrap), with_timeout(control_memory, bootstrap.timeout())), options) {}

    /// Over an existing shm_transport as the control channel (no messages in flight).
    /// With CHORUS_DEBUG set, every rank says on stderr which GPU it took and in which mode
    /// the GPU runs (MPS, how many devices), where the choice of schedules depends on them.
    explicit cuda_ipc_transport(shm_transport&& control, cuda_ipc_options options = {})
        : base(std::move(control),
               staged_config{options.chunk, options.slots, options.direct_bytes, options.rendezvous_bytes, signals_wanted(options, control)},
               detail::cuda_ipc_device(detail::cuda_pick_device(options.device, control.local_rank()))) {
        if (detail::debug_enabled()) describe(options);
    }

    /// The options from CHORUS_CUDA_DEVICE, CHORUS_CUDA_CHUNK_BYTES, CHORUS_CUDA_SLOTS,
    /// CHORUS_CUDA_DIRECT_BYTES, CHORUS_CUDA_RENDEZVOUS_BYTES and CHORUS_CUDA_SIGNALS (0 or 1).
    static cuda_ipc_options options_from_env() {
        detail::env_reader const env("cuda_ipc_transport::from_env");
        cuda_ipc_options o;
        o.device = static_cast<int>(env.number_at_least("CHORUS_CUDA_DEVICE", 0, o.device));
        o.chunk = static_cast<std::size_t>(env.number_at_least("CHORUS_CUDA_CHUNK_BYTES", 1, static_cast<long long>(o.chunk)));
        o.slots = static_cast<std::size_t>(env.number_at_least("CHORUS_CUDA_SLOTS", 1, static_cast<long long>(o.slots)));
        o.direct_bytes = static_cast<std::size_t>(
            env.number_at_least("CHORUS_CUDA_DIRECT_BYTES", 0, static_cast<long long>(o.direct_bytes)));
        o.rendezvous_bytes = static_cast<std::size_t>(
            env.number_at_least("CHORUS_CUDA_RENDEZVOUS_BYTES", 0, static_cast<long long>(o.rendezvous_bytes)));
        if (!detail::env_reader::get({"CHORUS_CUDA_SIGNALS"}).empty()) {
            long long const v = env.number_at_least("CHORUS_CUDA_SIGNALS", 0, o.signals);
            if (v > 1) throw invalid_argument("cuda_ipc_transport::from_env: CHORUS_CUDA_SIGNALS is 0 (off) or 1 (on), not " + std::to_string(v));
            o.signals = static_cast<int>(v);
        }
        return o;
    }
    /// The launcher's variables (tcp_config_from_env), options_from_env() and the shared
    /// memory's CHORUS_* settings (shm_config_from_env, with rings of 64 KiB unless
    /// CHORUS_SHM_RING_BYTES says otherwise); errors name cuda_ipc_transport::from_env.
    static cuda_ipc_config config_from_env() {
        char const* const caller = "cuda_ipc_transport::from_env";
        shm_config memory = shm_config_from_env(caller);
        if (detail::env_reader::get({"CHORUS_SHM_RING_BYTES"}).empty()) memory.ring_bytes = detail::cuda_control_memory().ring_bytes;
        memory.direct_bytes = 0;
        return {tcp_config_from_env(caller), options_from_env(), memory};
    }
    static cuda_ipc_transport from_env() { return cuda_ipc_transport(config_from_env()); }

    /// Ring allreduce segments (detail::ring_segment_bytes_of): each chunk costs two device
    /// copies, their event waits and a control message each way, while a 256 KiB device copy
    /// takes a few microseconds, so the ring's messages are as large as the default FIFO chunk.
    static constexpr std::size_t ring_segment_bytes = std::size_t{4} << 20;

    /// The CUDA device ordinal this rank uses.
    int device_ordinal() noexcept { return device().ordinal(); }
    /// Waits for all of chorus's queued device work (the last reduction of a collective), then
    /// throws if a signaled launch among it failed (the group failed: a rank did not come within
    /// the timeout, or called it differently), as the next call would — or if the group had
    /// failed before (cleanup after a caught error: destroy the transport instead).
    void synchronize() {
        cuda_device_memory::synchronize();
        check_launches();
    }

private:
    // Without MPS the kernels of different processes on one GPU are time-sliced, never run at
    // once: signaled launches only where MPS is on, or every rank (of this node: the control
    // channel's) has a GPU of its own, unless the options say.
    static bool signals_wanted(cuda_ipc_options const& options, shm_transport const& control) {
        if (options.signals >= 0) return options.signals == 1;
        std::string pipe;
        if (detail::cuda_mps_on(pipe)) return true;
        int devices = 0;
        detail::cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
        return options.device < 0 && control.size() <= devices;
    }

    void describe(cuda_ipc_options const& options) {
        int devices = 0;
        (void)cudaGetDeviceCount(&devices);
        cudaDeviceProp prop{};
        (void)cudaGetDeviceProperties(&prop, device_ordinal());
        std::string pipe;
        bool const mps = detail::cuda_mps_on(pipe);
        std::fprintf(stderr,
                     "chorus: rank %d/%d cuda_ipc on GPU %d of %d (%s); MPS %s (%s/control); one_shot up to %zu bytes, "
                     "signaled launches %s; FIFOs %zu x %zu bytes per peer, rendezvous from %zu bytes (0: never); control through "
                     "shared memory\n",
                     rank(), size(), device_ordinal(), devices, prop.name, mps ? "on" : "off: kernels of the ranks sharing a GPU are time-sliced",
                     pipe.c_str(), options.direct_bytes,
                     signals_wanted(options, control()) ? "asked for (used where every rank asks)" : "off (CHORUS_CUDA_SIGNALS=1 forces them)",
                     options.slots, options.chunk,
                     options.rendezvous_bytes);
    }

    static shm_config with_timeout(shm_config c, std::chrono::milliseconds timeout) noexcept {
        c.timeout = timeout;
        return c;
    }
};

} // namespace chorus
