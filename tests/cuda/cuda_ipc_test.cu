// SPDX-License-Identifier: MIT
// The CUDA IPC transport's tests, one program run by chorusrun (one rank per process, as CUDA
// IPC needs: a process cannot open its own handles):
//   cuda_ipc_test matrix    every collective x algorithm x op x dtype (int32, int64, float,
//                           double, __half, __nv_bfloat16) x sizes {0, 1, p-1, p+1, 4099} on
//                           device buffers, against closed forms computed on the host;
//   cuda_ipc_test generic   one user function template instantiated with tcp_transport (host
//                           vectors) and with cuda_ipc_transport (device buffers);
//   cuda_ipc_test errors    bad input on device buffers fails on every rank with chorus errors;
//   cuda_ipc_test one_shot_errors, one_shot_limit_errors: the same for one_shot rounds, rank 1
//                           with another size below, or above, the one_shot limit;
//   cuda_ipc_test killed    3 ranks, rank 2 SIGKILLed mid-collective: the others name it;
//   cuda_ipc_test streams   collectives ordered on a program's stream (cuda_stream_guard); a
//                           signaled allreduce captured into a CUDA graph and replayed (where
//                           signals are on), a collective that waits on the host (a ring
//                           allreduce) refused, on every rank, inside a capture.
// Without a usable GPU every rank prints why and exits 77, which ctest reports as skipped
// (SKIP_RETURN_CODE), never as passed.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/cuda_ipc.hpp>
#include <chorus/transport/tcp.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace {

using chorus::rank_t;

int skip_without_gpu() {
    int count = 0;
    cudaError_t const e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        std::printf("SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
                    e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e), count);
        return 77;
    }
    return 0;
}

// Throws, so that the transport's destructor still runs and the peers learn of the failure.
void check_cuda(cudaError_t e, char const* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// A device array of n elements (RAII), with host round trips.
template <class T>
class device_array {
public:
    explicit device_array(std::size_t n) : n_(n) {
        if (n) check_cuda(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
    }
    explicit device_array(std::vector<T> const& host) : device_array(host.size()) { put(host); }
    device_array(device_array const&) = delete;
    device_array& operator=(device_array const&) = delete;
    ~device_array() {
        if (p_) cudaFree(p_);
    }
    std::span<T> span() const noexcept { return {p_, n_}; }
    void put(std::vector<T> const& host) {
        if (n_) check_cuda(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    }
    std::vector<T> get() const {
        std::vector<T> host(n_);
        // A synchronous copy on the legacy stream: it waits for chorus's queued work.
        if (n_) check_cuda(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
        return host;
    }

private:
    T* p_ = nullptr;
    std::size_t n_;
};

template <class T>
double to_double(T x) {
    if constexpr (std::is_same_v<T, __half>) return static_cast<double>(__half2float(x));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<double>(__bfloat162float(x));
    else return static_cast<double>(x);
}
template <class T>
T from_double(double d) {
    if constexpr (std::is_same_v<T, __half>) return __float2half(static_cast<float>(d));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(static_cast<float>(d));
    else return static_cast<T>(d);
}
template <class T>
char const* type_name() {
    if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
    else if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, __half>) return "half";
    else return "bfloat16";
}
template <class Op>
char const* op_name() {
    if constexpr (std::is_same_v<Op, chorus::sum>) return "sum";
    else if constexpr (std::is_same_v<Op, chorus::prod>) return "prod";
    else if constexpr (std::is_same_v<Op, chorus::minimum>) return "min";
    else if constexpr (std::is_same_v<Op, chorus::maximum>) return "max";
    else if constexpr (std::is_same_v<Op, chorus::avg>) return "avg";
    else if constexpr (std::is_same_v<Op, chorus::bit_and>) return "band";
    else if constexpr (std::is_same_v<Op, chorus::bit_or>) return "bor";
    else if constexpr (std::is_same_v<Op, chorus::bit_xor>) return "bxor";
    else return "user(larger magnitude)";
}

/// A user-defined operation, callable on the device: the larger magnitude, declared
/// commutative with chorus::commutative so that the ring schedules may use it.
struct larger_magnitude_fn {
    template <class T>
    CHORUS_HOST_DEVICE constexpr T operator()(T const& a, T const& b) const noexcept {
        return (a < T{} ? -a : a) < (b < T{} ? -b : b) ? b : a;
    }
};
using larger_magnitude = chorus::commutative_op<larger_magnitude_fn>;

struct tally {
    long checks = 0, failed = 0;
    std::string first;
    template <class T, class Want>
    void compare(std::string const& what, std::vector<T> const& got, Want want, double tolerance) {
        ++checks;
        std::size_t wrong = 0, at = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            double const g = to_double(got[i]), w = want(i);
            if (std::fabs(g - w) > tolerance * (std::fabs(w) > 1 ? std::fabs(w) : 1.0)) {
                if (!wrong) at = i;
                ++wrong;
            }
        }
        if (wrong) {
            ++failed;
            if (first.empty())
                first = what + ": " + std::to_string(wrong) + " of " + std::to_string(got.size()) + " wrong, first at " +
                        std::to_string(at) + " (got " + std::to_string(to_double(got[at])) + ", want " + std::to_string(want(at)) + ")";
        }
    }
};

template <class T>
constexpr double tolerance() {
    if constexpr (std::is_integral_v<T>) return 0;
    else if constexpr (std::is_same_v<T, float>) return 1e-6;
    else if constexpr (std::is_same_v<T, double>) return 1e-12;
    else return 1e-2;  // half and bfloat16: an average of small integers rounds
}

// Small values keep every sum exact in half and bfloat16 (<= 24 over 8 ranks) and every
// product exact (powers of 2 up to 256).
template <class Op>
double value(rank_t r, std::size_t i) {
    if constexpr (std::is_same_v<Op, chorus::prod>) return static_cast<double>((static_cast<std::size_t>(r) + i) % 2 + 1);
    else return static_cast<double>((static_cast<std::size_t>(r) * 2 + i * 7) % 3 + 1);
}

/// The reduction over ranks of value(r, i), folded in rank order with the operation itself
/// (in T for integers, in double for floating point), finalised as the op says.
template <class T, class Op>
double expected(rank_t p, std::size_t i) {
    using acc_t = std::conditional_t<std::is_integral_v<T>, T, double>;
    Op const op{};
    acc_t acc = static_cast<acc_t>(value<Op>(0, i));
    for (rank_t r = 1; r < p; ++r) acc = op(acc, static_cast<acc_t>(value<Op>(r, i)));
    if constexpr (chorus::has_finalize<Op, acc_t>) acc = op.finalize(acc, p);
    return static_cast<double>(acc);
}

template <class T, class Op>
std::vector<T> contribution(rank_t r, std::size_t n, std::size_t offset = 0) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = from_double<T>(value<Op>(r, offset + i));
    return v;
}

std::string label(char const* what, char const* algo, char const* type, char const* op, std::size_t n) {
    return std::string(what) + "<" + algo + "> " + type + " " + op + " n=" + std::to_string(n);
}

template <class T, class Op>
void reductions(chorus::cuda_ipc_transport& tp, tally& t, std::vector<std::size_t> const& sizes) {
    rank_t const p = tp.size(), me = tp.rank();
    auto const P = static_cast<std::size_t>(p);
    for (std::size_t n : sizes) {
        auto const want = [&](std::size_t i) { return expected<T, Op>(p, i); };
        auto run_allreduce = [&]<class Algo>(char const* name) {
            device_array<T> d(contribution<T, Op>(me, n));
            chorus::allreduce<Algo>(tp, d.span(), Op{});
            t.compare(label("allreduce", name, type_name<T>(), op_name<Op>(), n), d.get(), want, tolerance<T>());
        };
        run_allreduce.template operator()<chorus::automatic>("auto");
        run_allreduce.template operator()<chorus::ring>("ring");
        run_allreduce.template operator()<chorus::tree>("tree");
        run_allreduce.template operator()<chorus::recursive_doubling>("recursive_doubling");
        run_allreduce.template operator()<chorus::rabenseifner>("rabenseifner");
        run_allreduce.template operator()<chorus::one_shot>("one_shot");
        run_allreduce.template operator()<chorus::two_shot>("two_shot");

        for (rank_t root : {rank_t{0}, p - 1}) {
            device_array<T> in(contribution<T, Op>(me, n)), out(n);
            chorus::reduce(tp, in.span(), out.span(), Op{}, root);
            if (me == root) t.compare(label("reduce", "tree", type_name<T>(), op_name<Op>(), n) + " root=" + std::to_string(root), out.get(), want, tolerance<T>());
        }

        // reduce_scatter: n elements per rank, p * n in.
        auto run_reduce_scatter = [&]<class Algo>(char const* name) {
            device_array<T> in(contribution<T, Op>(me, P * n)), out(n);
            chorus::reduce_scatter<Algo>(tp, in.span(), out.span(), Op{});
            auto const mine = [&](std::size_t i) { return expected<T, Op>(p, static_cast<std::size_t>(me) * n + i); };
            t.compare(label("reduce_scatter", name, type_name<T>(), op_name<Op>(), n), out.get(), mine, tolerance<T>());
        };
        run_reduce_scatter.template operator()<chorus::ring>("ring");
        run_reduce_scatter.template operator()<chorus::tree>("tree");
        run_reduce_scatter.template operator()<chorus::one_shot>("one_shot");
        run_reduce_scatter.template operator()<chorus::zero_copy>("zero_copy");
    }
}

template <class T>
void movements(chorus::cuda_ipc_transport& tp, tally& t, std::vector<std::size_t> const& sizes) {
    rank_t const p = tp.size(), me = tp.rank();
    auto const P = static_cast<std::size_t>(p), M = static_cast<std::size_t>(me);
    auto const v = [](rank_t r, std::size_t i) { return static_cast<double>((static_cast<std::size_t>(r) * 37 + i) % 200); };
    auto const mine = [&](std::size_t n, std::size_t offset = 0) {
        std::vector<T> x(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = from_double<T>(v(me, offset + i));
        return x;
    };
    char const* const ty = type_name<T>();
    for (std::size_t n : sizes) {
        for (rank_t root : {rank_t{0}, p - 1, p / 2}) {
            auto const from_root = [&](std::size_t i) { return v(root, i); };
            auto run_broadcast = [&]<class Algo>(char const* name) {
                device_array<T> d(me == root ? mine(n) : std::vector<T>(n, from_double<T>(-1)));
                chorus::broadcast<Algo>(tp, d.span(), root);
                t.compare(label("broadcast", name, ty, "-", n) + " root=" + std::to_string(root), d.get(), from_root, 0);
            };
            run_broadcast.template operator()<chorus::tree>("tree");
            run_broadcast.template operator()<chorus::linear>("linear");
            run_broadcast.template operator()<chorus::scatter_allgather>("scatter_allgather");
            run_broadcast.template operator()<chorus::one_shot>("one_shot");
            run_broadcast.template operator()<chorus::zero_copy>("zero_copy");

            // scatter: block r of the root's p*n elements; gather: the reverse.
            device_array<T> all(me == root ? mine(P * n) : std::vector<T>(P * n)), block(n);
            chorus::scatter(tp, all.span(), block.span(), root);
            t.compare(label("scatter", "linear", ty, "-", n) + " root=" + std::to_string(root), block.get(),
                      [&](std::size_t i) { return v(root, M * n + i); }, 0);
            device_array<T> part(mine(n)), gathered(P * n);
            chorus::gather(tp, part.span(), gathered.span(), root);
            if (me == root)
                t.compare(label("gather", "linear", ty, "-", n) + " root=" + std::to_string(root), gathered.get(),
                          [&](std::size_t i) { return v(static_cast<rank_t>(i / (n ? n : 1)), i % (n ? n : 1)); }, 0);
        }
        auto const gathered = [&](std::size_t i) { return v(static_cast<rank_t>(i / n), i % n); };
        auto run_allgather = [&]<class Algo>(char const* name) {
            device_array<T> part(mine(n)), all(P * n);
            chorus::allgather<Algo>(tp, part.span(), all.span());
            t.compare(label("allgather", name, ty, "-", n), all.get(), gathered, 0);
        };
        run_allgather.template operator()<chorus::ring>("ring");
        run_allgather.template operator()<chorus::bruck>("bruck");
        run_allgather.template operator()<chorus::one_shot>("one_shot");
        run_allgather.template operator()<chorus::zero_copy>("zero_copy");

        // alltoall: my block j goes to rank j; block i of the result came from rank i.
        auto const transposed = [&](std::size_t i) { return v(static_cast<rank_t>(i / n), M * n + i % n); };
        auto run_alltoall = [&]<class Algo>(char const* name) {
            device_array<T> send(mine(P * n)), recv(P * n);
            chorus::alltoall<Algo>(tp, send.span(), recv.span());
            t.compare(label("alltoall", name, ty, "-", n), recv.get(), transposed, 0);
        };
        run_alltoall.template operator()<chorus::pairwise>("pairwise");
        run_alltoall.template operator()<chorus::bruck>("bruck");
        run_alltoall.template operator()<chorus::one_shot>("one_shot");
        run_alltoall.template operator()<chorus::zero_copy>("zero_copy");

        // alltoallv: rank r sends (r + j + n) % 3 elements to rank j.
        auto const count = [&](std::size_t from, std::size_t to) { return (from + to + n) % 3; };
        std::vector<std::size_t> sc(P), rc(P);
        std::size_t st = 0, rt = 0;
        for (std::size_t j = 0; j < P; ++j) st += sc[j] = count(M, j), rt += rc[j] = count(j, M);
        std::vector<double> want;
        for (std::size_t j = 0; j < P; ++j) {
            std::size_t offset = 0;  // where rank j's block for me starts in j's send buffer
            for (std::size_t k = 0; k < M; ++k) offset += count(j, k);
            for (std::size_t k = 0; k < rc[j]; ++k) want.push_back(v(static_cast<rank_t>(j), offset + k));
        }
        auto run_alltoallv = [&]<class Algo>(char const* name) {
            device_array<T> vs(mine(st)), vr(rt);
            chorus::alltoallv<Algo>(tp, vs.span(), sc, vr.span(), rc);
            t.compare(label("alltoallv", name, ty, "-", n), vr.get(), [&](std::size_t i) { return want[i]; }, 0);
        };
        run_alltoallv.template operator()<chorus::pairwise>("pairwise");
        run_alltoallv.template operator()<chorus::zero_copy>("zero_copy");
        run_alltoallv.template operator()<chorus::automatic>("auto");

        // point to point around the ring, and sendrecv the other way
        device_array<T> out(mine(n)), in(n);
        rank_t const next = (me + 1) % p, prev = (me + p - 1) % p;
        chorus::sendrecv(tp, next, out.span(), prev, in.span(), /*tag=*/7);
        t.compare(label("sendrecv", "-", ty, "-", n), in.get(), [&](std::size_t i) { return v(prev, i); }, 0);
        if (p > 1) {
            if (me % 2 == 0) {
                chorus::send(tp, next, out.span(), 8);
                chorus::recv(tp, prev, in.span(), 8);
            } else {
                chorus::recv(tp, prev, in.span(), 8);
                chorus::send(tp, next, out.span(), 8);
            }
            t.compare(label("send/recv", "-", ty, "-", n), in.get(), [&](std::size_t i) { return v(prev, i); }, 0);
        }
    }
    chorus::barrier<chorus::one_shot>(tp);
    chorus::barrier(tp);
}

template <class T>
void all_reductions(chorus::cuda_ipc_transport& tp, tally& t, std::vector<std::size_t> const& sizes) {
    reductions<T, chorus::sum>(tp, t, sizes);
    reductions<T, chorus::prod>(tp, t, sizes);
    reductions<T, chorus::minimum>(tp, t, sizes);
    reductions<T, chorus::maximum>(tp, t, sizes);
    reductions<T, chorus::avg>(tp, t, sizes);
    if constexpr (std::is_integral_v<T>) {
        reductions<T, chorus::bit_and>(tp, t, sizes);
        reductions<T, chorus::bit_or>(tp, t, sizes);
        reductions<T, chorus::bit_xor>(tp, t, sizes);
    }
}

int report(chorus::cuda_ipc_transport const& tp, tally const& t, char const* what) {
    if (t.failed || t.checks == 0) {
        std::fprintf(stderr, "rank %d: %ld of %ld %s checks wrong; first: %s\n", tp.rank(), t.failed, t.checks, what, t.first.c_str());
        return 2;
    }
    std::printf("rank %d: %ld %s checks passed (%d ranks, device %d)\n", tp.rank(), t.checks, what, tp.size(),
                const_cast<chorus::cuda_ipc_transport&>(tp).device_ordinal());
    return 0;
}

int matrix() {
    auto tp = chorus::cuda_ipc_transport::from_env();
    rank_t const p = tp.size();
    auto const P = static_cast<std::size_t>(p);
    std::vector<std::size_t> const sizes{0, 1, P > 1 ? P - 1 : 2, P + 1, 4099};
    tally t;
    all_reductions<std::int32_t>(tp, t, sizes);
    all_reductions<std::int64_t>(tp, t, sizes);
    all_reductions<float>(tp, t, sizes);
    all_reductions<double>(tp, t, sizes);
    all_reductions<__half>(tp, t, sizes);
    all_reductions<__nv_bfloat16>(tp, t, sizes);
    reductions<float, larger_magnitude>(tp, t, sizes);
    reductions<double, larger_magnitude>(tp, t, sizes);
    movements<std::int32_t>(tp, t, sizes);
    movements<double>(tp, t, sizes);
    movements<__half>(tp, t, sizes);
    // Point to point of 24 MiB + 12 bytes, above the default rendezvous size (16 MiB): to the
    // next rank, arriving before its receive is posted (copied from the sender's buffer into
    // staging at once, so that the send completes), then with the receive posted first (one
    // copy, into it); to this rank itself through its own FIFO, in more chunks than it has
    // slots; and at the end from a stream-ordered pool, which CUDA IPC cannot share (chunks).
    {
        std::size_t const n = (std::size_t{24} << 20) / sizeof(float) + 3;
        auto const pattern = [](rank_t r, std::size_t i) { return static_cast<double>((static_cast<std::size_t>(r) * 7919 + i) % 65536); };
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(pattern(tp.rank(), i));
        device_array<float> out(host), from_prev(n), from_self(n);
        rank_t const prev = (tp.rank() + p - 1) % p;
        auto s = chorus::isend(tp, (tp.rank() + 1) % p, out.span(), 7);
        chorus::barrier(tp);  // progress drains the message into staging meanwhile
        chorus::recv(tp, prev, from_prev.span(), 7);
        s.wait();
        t.compare("send/recv float 24 MiB from rank-1, unexpected", from_prev.get(), [&](std::size_t i) { return pattern(prev, i); }, 0);
        {
            device_array<float> posted_first(n);
            auto r = chorus::irecv(tp, prev, posted_first.span(), 9);
            chorus::barrier(tp);
            chorus::send(tp, (tp.rank() + 1) % p, out.span(), 9);
            r.wait();
            t.compare("send/recv float 24 MiB from rank-1, receive posted first", posted_first.get(),
                      [&](std::size_t i) { return pattern(prev, i); }, 0);
        }
        chorus::sendrecv(tp, tp.rank(), out.span(), tp.rank(), from_self.span(), 8);
        t.compare("sendrecv float 24 MiB to self", from_self.get(), [&](std::size_t i) { return pattern(tp.rank(), i); }, 0);

        device_array<float> d(contribution<float, chorus::sum>(tp.rank(), n));
        chorus::allreduce<chorus::ring>(tp, d.span(), chorus::sum{});
        t.compare("allreduce<ring> float sum 24 MiB", d.get(), [&](std::size_t i) { return expected<float, chorus::sum>(p, i); }, 1e-6);

        // two_shot, the automatic choice at this size: the vectors read in place through their
        // allocations' IPC handles — a vector inside a larger allocation (an offset), the same
        // allocation again (opened once), then a vector from a stream-ordered pool on rank 0,
        // which CUDA IPC cannot share: every rank takes the ring instead.
        auto const want = [&](std::size_t i) { return expected<float, chorus::sum>(p, i); };
        auto const values = contribution<float, chorus::sum>(tp.rank(), n);
        // Device memory that is not a device_array's (an offset inside one, a pool's), to and fro.
        auto const load = [](std::span<float> to, std::vector<float> const& from) {
            check_cuda(cudaMemcpy(to.data(), from.data(), to.size_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
        };
        auto const read = [](std::span<float const> from) {
            std::vector<float> got(from.size());
            check_cuda(cudaMemcpy(got.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
            return got;
        };
        device_array<float> big(n + 1000);
        std::span<float> const inner = big.span().subspan(1000);
        for (int k = 0; k < 2; ++k) {
            load(inner, values);
            chorus::allreduce(tp, inner, chorus::sum{});
            t.compare("allreduce auto (two_shot) float sum 24 MiB at an offset, call " + std::to_string(k), read(inner), want, 1e-6);
        }
        // zero_copy, the automatic broadcast at this size: the last rank's vector read where it
        // lies, at the same offset (its allocation opened by every other rank, then closed).
        {
            auto const rooted = contribution<float, chorus::sum>(p - 1, n);
            load(inner, tp.rank() == p - 1 ? rooted : values);
            chorus::broadcast(tp, inner, p - 1);
            t.compare("broadcast auto (zero_copy) float 24 MiB at an offset, root " + std::to_string(p - 1), read(inner),
                      [&](std::size_t i) { return static_cast<double>(rooted[i]); }, 0);
        }
        // The same allocation registered: its IPC handle exported and opened once by each peer for
        // the calls below (two_shot on the vector at its offset, zero_copy allgather of a part),
        // closed by deregister_buffer, after which the allocation is freed as usual.
        {
            auto const reg = chorus::register_buffer(tp, big.span());
            if (!reg.kept() && t.failed++ == 0) t.first = "register_buffer of a cudaMalloc allocation kept nothing";
            ++t.checks;
            device_array<float> gathered(n / 8 * static_cast<std::size_t>(p));
            std::vector<std::vector<float>> blocks;
            for (rank_t r = 0; r < p; ++r) blocks.push_back(contribution<float, chorus::sum>(r, n / 8));
            for (int k = 0; k < 3; ++k) {
                load(inner, values);
                chorus::allreduce(tp, inner, chorus::sum{});
                t.compare("allreduce auto (two_shot) float sum 24 MiB, registered, call " + std::to_string(k), read(inner), want, 1e-6);
                // Each rank's block its own (contribution r): a rank read twice or none would show.
                load(inner.subspan(0, n / 8), blocks[static_cast<std::size_t>(tp.rank())]);
                chorus::allgather<chorus::zero_copy>(tp, inner.subspan(0, n / 8), gathered.span());
                t.compare("allgather<zero_copy> float 3 MiB blocks, registered, call " + std::to_string(k), gathered.get(),
                          [&](std::size_t i) { return static_cast<double>(blocks[i / (n / 8)][i % (n / 8)]); }, 0);
            }
            chorus::deregister_buffer(tp, reg);
        }
        // The fold's operands out of line: rank r's vector starts r elements further into its
        // allocation, so the ranks' slices lie at different offsets modulo 16 and two_shot's fold
        // goes element by element (detail/elementwise.hpp); then half and bfloat16, lined up (16
        // bytes per load, with a head and a tail where a slice starts mid-vector) and out of line.
        {
            std::size_t const m = n - 8, shift = static_cast<std::size_t>(tp.rank());
            std::span<float> const shifted = big.span().subspan(1000 + shift, m);
            load(shifted, contribution<float, chorus::sum>(tp.rank(), m));
            chorus::allreduce<chorus::two_shot>(tp, shifted, chorus::sum{});
            t.compare("allreduce<two_shot> float sum 24 MiB, rank r's vector r elements further in", read(shifted), want, 1e-6);
            auto const sixteen_bits = [&]<class H>() {
                device_array<H> h(m + 8);
                for (std::size_t s : {std::size_t{0}, shift}) {
                    std::span<H> const v = h.span().subspan(s, m);
                    auto const mine = contribution<H, chorus::sum>(tp.rank(), m);
                    check_cuda(cudaMemcpy(v.data(), mine.data(), m * sizeof(H), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
                    chorus::allreduce<chorus::two_shot>(tp, v, chorus::sum{});
                    std::vector<H> got(m);
                    check_cuda(cudaMemcpy(got.data(), v.data(), m * sizeof(H), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
                    t.compare(std::string("allreduce<two_shot> ") + type_name<H>() + " sum 12 MiB" + (s ? ", rank r's vector r elements further in" : ""),
                              got, [&](std::size_t i) { return expected<H, chorus::sum>(p, i); }, tolerance<H>());
                }
            };
            sixteen_bits.template operator()<__half>();
            sixteen_bits.template operator()<__nv_bfloat16>();
        }
        float* pooled = nullptr;
        if (tp.rank() == 0) check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&pooled), n * sizeof(float), nullptr), "cudaMallocAsync");
        else check_cuda(cudaMalloc(reinterpret_cast<void**>(&pooled), n * sizeof(float)), "cudaMalloc");
        load(std::span<float>(pooled, n), values);
        chorus::allreduce<chorus::two_shot>(tp, std::span<float>(pooled, n), chorus::sum{});
        t.compare("allreduce<two_shot> float sum 24 MiB, rank 0's from cudaMallocAsync (the ring instead)", read(std::span<float const>(pooled, n)), want, 1e-6);
        // Rank 0's pool memory in chunks, the others' by rendezvous: every rank receives the sum.
        chorus::sendrecv(tp, (tp.rank() + 1) % p, std::span<float const>(pooled, n), prev, from_prev.span(), 11);
        t.compare("sendrecv float 24 MiB, rank 0's from cudaMallocAsync (through the FIFO)", from_prev.get(), want, 1e-6);
        if (tp.rank() == 0) check_cuda(cudaFreeAsync(pooled, nullptr), "cudaFreeAsync");
        else check_cuda(cudaFree(pooled), "cudaFree");
    }
    chorus::barrier(tp);
    return report(tp, t, "matrix");
}

// ---- the same user code over both transports, chosen at compile time ----

/// What a user writes once: averages a gradient buffer across ranks, whatever the transport
/// and wherever the buffer lives (the transport's memory space decides).
template <chorus::transport Transport, class Buffer>
void average_gradients(Transport& tp, Buffer&& grads) {
    chorus::allreduce(tp, std::forward<Buffer>(grads), chorus::avg{});
}

int generic() {
    tally t;
    auto host = chorus::tcp_transport::from_env();
    rank_t const p = host.size(), me = host.rank();
    std::size_t const n = 1000003;
    auto const want = [&](std::size_t i) { return expected<float, chorus::avg>(p, i); };
    {
        auto v = contribution<float, chorus::avg>(me, n);
        average_gradients(host, v);  // tcp_transport, std::vector<float>
        t.compare("average_gradients<tcp_transport>(std::vector<float>)", v, want, 1e-6);
    }
    // The control channel of the device transport is the same TCP group: no second rendezvous.
    chorus::cuda_ipc_transport dev(std::move(host));
    device_array<float> d(contribution<float, chorus::avg>(me, n));
    average_gradients(dev, d.span());  // cuda_ipc_transport, std::span<float> over device memory
    dev.synchronize();
    t.compare("average_gradients<cuda_ipc_transport>(device span)", d.get(), want, 1e-6);
    static_assert(std::is_same_v<chorus::tcp_transport::memory_space, chorus::host_memory>);
    static_assert(std::is_same_v<chorus::cuda_ipc_transport::memory_space, chorus::cuda_device_memory>);
    static_assert(chorus::exposing_transport<chorus::cuda_ipc_transport>);
    static_assert(chorus::registering_transport<chorus::cuda_ipc_transport>);
    // The ring's segments follow the transport: 4 MiB messages on the device, 1 MiB over TCP,
    // 256 KiB by default (the loopback transport declares none).
    static_assert(chorus::detail::declared_ring_segment_bytes<chorus::cuda_ipc_transport>() == (std::size_t{4} << 20));
    static_assert(chorus::detail::declared_ring_segment_bytes<chorus::tcp_transport>() == (std::size_t{1} << 20));
    static_assert(chorus::detail::declared_ring_segment_bytes<chorus::loopback_transport>() == (std::size_t{256} << 10));
    chorus::barrier(dev);
    return report(dev, t, "generic");
}

int errors() {
    auto tp = chorus::cuda_ipc_transport::from_env();
    tally t;
    rank_t const me = tp.rank();
    // Mismatched sizes: rank 1 passes one element more. Every rank must throw a chorus error.
    device_array<float> d(me == 1 ? 1001 : 1000);
    bool threw = false;
    std::string what;
    try {
        chorus::allreduce<chorus::ring>(tp, d.span(), chorus::sum{});
    } catch (chorus::error const& e) {
        threw = true;
        what = e.what();
    }
    ++t.checks;
    if (!threw) {
        ++t.failed;
        t.first = "the mismatched allreduce returned";
    }
    std::printf("rank %d: mismatched allreduce: %s\n", me, threw ? what.c_str() : "no error");
    return report(tp, t, "errors");
}

// one_shot rounds called with different sizes: every rank names rank 1's shape (`limit`
// false), or rank 1 is above the one_shot limit and sends messages to ranks that exchange
// (`limit` true): every rank says so at once, not at the timeout.
int one_shot_errors(bool limit) {
    auto tp = chorus::cuda_ipc_transport::from_env();
    tally t;
    std::size_t const n1 = limit ? tp.direct_bytes() / sizeof(float) + 1 : 5;
    device_array<float> d(tp.rank() == 1 ? n1 : 4);
    std::string said;
    try {
        chorus::allreduce(tp, d.span(), chorus::sum{});
        tp.synchronize();  // a signaled launch fails on the device: its error comes here
    } catch (chorus::error const& e) {
        said = e.what();
    }
    ++t.checks;
    // Above the limit rank 1 sends messages (ring) or exposes its vector (two_shot, the
    // automatic choice over CUDA IPC): "different sizes" from the transport, or the shapes' check.
    char const* const want = limit ? "different sizes" : "rank 1 called allreduce with 20 bytes, rank 0 allreduce with 16 bytes";
    bool const named = said.find(want) != std::string::npos || (limit && said.find("their sizes differ") != std::string::npos);
    if (!named || said.find("timed out") != std::string::npos) {
        ++t.failed;
        t.first = "one_shot mismatch (rank 1: " + std::to_string(n1) + " floats): '" + said + "'";
    }
    std::printf("rank %d: mismatched one_shot allreduce: %s\n", tp.rank(), said.empty() ? "no error" : said.c_str());
    return report(tp, t, limit ? "one_shot limit errors" : "one_shot errors");
}

// Kernels for the stream test: a wait of about `cycles` clocks, a fill, and a count of the
// elements that differ from `want`.
__global__ void spin_kernel(long long cycles) {
    long long const start = clock64();
    while (clock64() - start < cycles) {
    }
}
__global__ void set_kernel(float* d, std::size_t n, float v) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) d[i] = v;
}
__global__ void count_kernel(float const* d, std::size_t n, float want, unsigned long long* wrong) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
        if (d[i] != want) atomicAdd(wrong, 1ull);
}

// chorus's work on a stream of the program's (cuda_stream_guard), non-blocking so that nothing
// but the stream orders it: a slow kernel and a fill queued there before the collective, a
// check queued after it, no synchronisation between — one_shot (1 KiB) and the ring (4 MiB).
// Then a capture of the stream into a CUDA graph makes the collective throw, on every rank.
int streams() {
    auto tp = chorus::cuda_ipc_transport::from_env();
    rank_t const p = tp.size(), me = tp.rank();
    tally t;
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    device_array<unsigned long long> wrong(1);
    chorus::barrier(tp);  // the peers' memory opened, outside the timed race below
    for (std::size_t const n : {std::size_t{256}, std::size_t{1} << 20}) {
        device_array<float> d(n);
        check_cuda(cudaMemsetAsync(wrong.span().data(), 0, sizeof(unsigned long long), s), "cudaMemsetAsync");
        spin_kernel<<<1, 1, 0, s>>>(20'000'000);  // ~10 ms: a collective not ordered on s reads the buffer unset
        set_kernel<<<chorus::detail::cuda_grid(n), chorus::detail::cuda_block, 0, s>>>(d.span().data(), n, static_cast<float>(me + 1));
        {
            chorus::cuda_stream_guard on(s);
            chorus::allreduce(tp, d.span(), chorus::sum{});
        }
        count_kernel<<<chorus::detail::cuda_grid(n), chorus::detail::cuda_block, 0, s>>>(d.span().data(), n,
                                                                                          static_cast<float>(p * (p + 1) / 2), wrong.span().data());
        check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        ++t.checks;
        if (unsigned long long const bad = wrong.get()[0]) {
            ++t.failed;
            t.first = "allreduce of " + std::to_string(n) + " floats on a program's stream: " + std::to_string(bad) + " wrong";
        }
    }
    // A signaled allreduce (one launch, no host wait) captured with the fill before it, then
    // the graph replayed: each replay's launch counts itself on the device, so the slots and
    // flags of replays and of eager calls between them follow each other as eager calls do.
    if (tp.signal_bytes() >= 256 * sizeof(float)) {
        chorus::barrier(tp);
        tp.synchronize();
        device_array<float> d(256);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
        set_kernel<<<1, 256, 0, s>>>(d.span().data(), 256, static_cast<float>(me + 1));
        {
            chorus::cuda_stream_guard on(s);
            chorus::allreduce(tp, d.span(), chorus::sum{});
        }
        check_cuda(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
        check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
        for (int replay = 0; replay < 4; ++replay) {
            check_cuda(cudaMemsetAsync(wrong.span().data(), 0, sizeof(unsigned long long), s), "cudaMemsetAsync");
            check_cuda(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
            count_kernel<<<1, 256, 0, s>>>(d.span().data(), 256, static_cast<float>(p * (p + 1) / 2), wrong.span().data());
            check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
            ++t.checks;
            if (unsigned long long const bad = wrong.get()[0]) {
                ++t.failed;
                t.first = "replay " + std::to_string(replay) + " of a captured allreduce: " + std::to_string(bad) + " wrong";
            }
            if (replay == 1) {  // an eager call between replays
                chorus::cuda_stream_guard on(s);
                chorus::allreduce(tp, d.span(), chorus::sum{});
            }
        }
        (void)cudaGraphExecDestroy(exec);
        (void)cudaGraphDestroy(graph);
        std::printf("rank %d: a signaled allreduce captured into a CUDA graph, replayed 4 times\n", me);
    }
    // Every rank done with the collectives above before any fails the group in the capture.
    chorus::barrier(tp);
    tp.synchronize();
    usleep(200'000);
    device_array<float> d(256);
    std::string said;
    check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
        chorus::cuda_stream_guard on(s);
        chorus::allreduce<chorus::ring>(tp, d.span(), chorus::sum{});  // messages: the host waits for their copies
    } catch (chorus::error const& e) {
        said = e.what();
    }
    cudaGraph_t graph = nullptr;
    cudaError_t const ended = cudaStreamEndCapture(s, &graph);  // intact: chorus queued nothing, synchronised nothing
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    ++t.checks;
    if (said.find("CUDA graph") == std::string::npos || ended != cudaSuccess) {
        ++t.failed;
        t.first = "a collective in a stream capture: '" + said + "', the capture ended with " + cudaGetErrorName(ended);
    }
    std::printf("rank %d: a ring allreduce in a stream capture: %s\n", me, said.empty() ? "no error" : said.c_str());
    cudaStreamDestroy(s);
    return report(tp, t, "stream");
}

// A rank killed in the middle of collectives: 3 ranks loop over a one_shot allreduce (1 KiB),
// a ring and a two_shot allreduce and a zero_copy broadcast (4 MiB) on device buffers; rank 2 SIGKILLs itself 300 ms in. The others
// must throw a chorus error naming rank 2 — no kernel or wait left spinning — and say when
// ("survived"); tests/gpu/run.sh checks both lines, then starts new groups on the same GPU.
int killed() {
    using clock = std::chrono::steady_clock;
    auto tp = chorus::cuda_ipc_transport::from_env();
    rank_t const me = tp.rank();
    if (tp.size() != 3) {
        std::fprintf(stderr, "cuda_ipc_test killed: needs 3 ranks\n");
        return 2;
    }
    device_array<float> small(std::vector<float>(256, 1.0f)), big(std::vector<float>(std::size_t{1} << 20, 1.0f));
    auto const start = clock::now();
    std::printf("rank %d: in the allreduce loop\n", me);
    std::fflush(stdout);
    try {
        for (;;) {
            if (me == 2 && clock::now() - start > std::chrono::milliseconds(300)) {
                std::printf("rank 2: killing myself\n");
                std::fflush(stdout);
                ::kill(::getpid(), SIGKILL);
            }
            chorus::allreduce(tp, small.span(), chorus::maximum{});  // one_shot: 1 KiB fits a round
            chorus::allreduce<chorus::ring>(tp, big.span(), chorus::maximum{});
            chorus::allreduce<chorus::two_shot>(tp, big.span(), chorus::maximum{});
            chorus::broadcast<chorus::zero_copy>(tp, big.span(), 0);
        }
    } catch (chorus::error const& e) {
        auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count();
        bool const named = std::string(e.what()).find("rank 2") != std::string::npos;
        std::printf("rank %d: %s %lld ms after the start: %s\n", me, named ? "survived, naming rank 2," : "failed without naming rank 2,",
                    static_cast<long long>(ms), e.what());
        std::fflush(stdout);  // before chorusrun stops the survivors (rank 2's death ends the job)
        return named ? 0 : 4;
    }
}

} // namespace

int main(int argc, char** argv) {
    if (int const skip = skip_without_gpu()) return skip;
    std::string const mode = argc > 1 ? argv[1] : "matrix";
    try {
        if (mode == "matrix") return matrix();
        if (mode == "generic") return generic();
        if (mode == "errors") return errors();
        if (mode == "one_shot_errors") return one_shot_errors(false);
        if (mode == "one_shot_limit_errors") return one_shot_errors(true);
        if (mode == "killed") return killed();
        if (mode == "streams") return streams();
        std::fprintf(stderr, "usage: cuda_ipc_test matrix|generic|errors|one_shot_errors|one_shot_limit_errors|killed|streams\n");
        return 2;
    } catch (chorus::error const& e) {
        std::fprintf(stderr, "chorus error: %s\n", e.what());
        return 1;
    } catch (std::exception const& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
