// SPDX-License-Identifier: MIT
// cuda_bench: chorus_bench's rows for the CUDA IPC transport, float32 on device buffers.
//
//   chorusrun -n 4 build-cuda/bench/cuda_bench [-b 4K] [-e 1G] [-f 4]
//                                              [--ops allreduce,allgather,broadcast,reduce_scatter,alltoall,alltoallv,sendrecv]
//                                              [--algo auto|all] [--iter-scale S] [--dtype float,half,bf16]
//
// --dtype: the allreduce's element types, one pass each (with --ops allreduce only; default
// float); a half or bfloat16 row's algo ends in _half or _bf16, its bytes are the vector's.
//
// Rows: `op algo ranks bytes count time_us algbw_GBps busbw_GBps wrong`, with chorus_bench's
// method: per iteration refill the inputs (a kernel, untimed), barrier, time one collective
// until its device work completed (cudaStreamSynchronize), take the maximum over ranks; the
// row is the median of the timed iterations; every output element is checked by a kernel
// (`wrong` counts mismatches over all ranks and iterations, and must be 0). bytes as in
// nccl-tests (allgather: the gathered output; reduce_scatter and alltoall: the whole send
// buffer; alltoallv, whose blocks are equal here, as alltoall; sendrecv: the message each rank
// sends its successor on the ring and receives from its predecessor); busbw factors allreduce
// 2(p-1)/p, allgather, reduce_scatter and alltoall(v) (p-1)/p, broadcast and sendrecv 1.
// sendrecv's rows name the way its messages took: `rendezvous` (one copy, from the sender's
// buffer) or `chunks` (through the FIFOs), as CHORUS_CUDA_RENDEZVOUS_BYTES decides. Rank 0 first prints the ceiling of the same run: device-to-device
// cudaMemcpy on its GPU at each size (`ceiling memcpy_d2d 1 ...`, busbw = bytes / time).
// Exits 77 without a usable GPU, 3 if any row had wrong != 0.

#include <cuda_runtime.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/cuda_ipc.hpp>
#include <chorus/transport/tcp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using chorus::rank_t;
using clock_type = std::chrono::steady_clock;

void cuda_ok(cudaError_t e, char const* what) {
    if (e != cudaSuccess) throw chorus::device_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Values exact in float: small integers.
__device__ float value(int rank, std::size_t i) { return static_cast<float>(rank % 13 + static_cast<int>(i % 7)); }

// In half and bfloat16 too: sums of up to 8 ranks' values stay below 256, every one exact.
template <class T>
__global__ void fill(T* p, std::size_t n, int rank, std::size_t offset) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
        p[i] = static_cast<T>(value(rank, offset + i));
}
__global__ void fill_constant(float* p, std::size_t n, float x) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
        p[i] = x;
}
// kind 0: allreduce sum over p ranks; 1: allgather of blocks of `block`; 2: broadcast from root;
// 3: reduce_scatter, the sum over p ranks of elements from `block` (the rank's block's offset)
// on; 4: alltoall to rank `root`, block r from rank r.
template <class T>
__global__ void check(T const* p, std::size_t n, int ranks, int kind, std::size_t block, int root, unsigned long long* wrong) {
    unsigned long long mine = 0;
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
        float want = 0;
        if (kind == 0) {
            for (int r = 0; r < ranks; ++r) want += value(r, i);
        } else if (kind == 1) {
            want = value(static_cast<int>(i / block), i % block);
        } else if (kind == 3) {
            for (int r = 0; r < ranks; ++r) want += value(r, block + i);
        } else if (kind == 4) {
            want = value(static_cast<int>(i / block), static_cast<std::size_t>(root) * block + i % block);
        } else {
            want = value(root, i);
        }
        mine += static_cast<float>(p[i]) != want;
    }
    if (mine) atomicAdd(wrong, mine);
}

std::size_t parse_size(std::string s) {
    std::size_t mult = 1;
    char const u = s.empty() ? '\0' : s.back();
    if (u == 'K' || u == 'k') mult = std::size_t{1} << 10;
    if (u == 'M' || u == 'm') mult = std::size_t{1} << 20;
    if (u == 'G' || u == 'g') mult = std::size_t{1} << 30;
    if (mult != 1) s.pop_back();
    return static_cast<std::size_t>(std::stoull(s)) * mult;
}

std::vector<std::string> split(std::string const& s) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start <= s.size()) {
        std::size_t const comma = s.find(',', start);
        out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

struct bench {
    chorus::cuda_ipc_transport& tp;
    float* time_slot;                 // device float for the max-over-ranks of a time
    unsigned long long* wrong_slot;   // device counter of wrong elements

    double max_over_ranks(double local_us) {
        float const x = static_cast<float>(local_us);
        cuda_ok(cudaMemcpy(time_slot, &x, sizeof x, cudaMemcpyHostToDevice), "cudaMemcpy");
        chorus::allreduce<chorus::recursive_doubling>(tp, std::span(time_slot, 1), chorus::maximum{});
        float y = 0;
        cuda_ok(cudaMemcpy(&y, time_slot, sizeof y, cudaMemcpyDeviceToHost), "cudaMemcpy");
        return y;
    }
    double total_wrong() {
        // The counter is a 64-bit integer: summed over ranks as such.
        auto* w = reinterpret_cast<long long*>(wrong_slot);
        chorus::allreduce<chorus::recursive_doubling>(tp, std::span(w, 1), chorus::sum{});
        long long host = 0;
        cuda_ok(cudaMemcpy(&host, w, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy");
        return static_cast<double>(host);
    }

    // Runs warm-up + timed iterations of `call` (which must enqueue its work), returns the
    // median of the per-iteration maxima over ranks; `prepare` refills, `verify` checks.
    template <class Prepare, class Call, class Verify>
    double time(int warmup, int iters, Prepare prepare, Call call, Verify verify) {
        std::vector<double> times;
        for (int it = 0; it < warmup + iters; ++it) {
            prepare();
            cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
            chorus::barrier(tp);
            auto const t0 = clock_type::now();
            call();
            cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
            double const us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
            verify();
            double const slowest = max_over_ranks(us);
            if (it >= warmup) times.push_back(slowest);
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
    }
};

} // namespace

int main(int argc, char** argv) {
    int devices = 0;
    if (cudaError_t const e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
        std::printf("cuda_bench: no usable CUDA device (%s): skipped\n", e == cudaSuccess ? "none visible" : cudaGetErrorName(e));
        return 77;
    }
    std::size_t begin = 4 << 10, end = std::size_t{1} << 30, factor = 4;
    std::vector<std::string> ops{"allreduce", "allgather", "broadcast"};
    std::string algo = "auto";
    std::vector<std::string> dtypes{"float"};
    double iter_scale = 1;
    for (int i = 1; i < argc; ++i) {
        std::string const a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "cuda_bench: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-b") begin = parse_size(next());
        else if (a == "-e") end = parse_size(next());
        else if (a == "-f") factor = parse_size(next());
        else if (a == "--ops") ops = split(next());
        else if (a == "--algo") algo = next();
        else if (a == "--dtype") dtypes = split(next());
        else if (a == "--iter-scale") iter_scale = std::stod(next());
        else {
            std::fprintf(stderr, "cuda_bench: unknown option %s (see the comment at the top of bench/cuda_bench.cu)\n", a.c_str());
            return 2;
        }
    }
    if (factor < 2) factor = 2;
    for (std::string const& t : dtypes) {
        if (t != "float" && t != "half" && t != "bf16") {
            std::fprintf(stderr, "cuda_bench: unknown dtype %s (float, half, bf16)\n", t.c_str());
            return 2;
        }
        if (t != "float" && (ops.size() != 1 || ops[0] != "allreduce")) {
            std::fprintf(stderr, "cuda_bench: --dtype %s is for --ops allreduce only\n", t.c_str());
            return 2;
        }
    }
    try {
        auto tp = chorus::cuda_ipc_transport::from_env();
        rank_t const p = tp.size(), me = tp.rank();
        auto const P = static_cast<std::size_t>(p);
        float* slot = nullptr;
        unsigned long long* wrong = nullptr;
        cuda_ok(cudaMalloc(&slot, sizeof(float)), "cudaMalloc");
        cuda_ok(cudaMalloc(&wrong, sizeof(unsigned long long)), "cudaMalloc");
        bench b{tp, slot, wrong};
        bool all_right = true;
        if (me == 0) {
            cudaDeviceProp prop{};
            cuda_ok(cudaGetDeviceProperties(&prop, tp.device_ordinal()), "cudaGetDeviceProperties");
            std::printf("# cuda_bench: %d ranks on %d visible GPU(s); rank 0 on device %d (%s); chunk and slots from CHORUS_CUDA_*\n",
                        p, devices, tp.device_ordinal(), prop.name);
            std::printf("%-16s %-20s %5s %12s %10s %12s %11s %11s %8s\n", "op", "algo", "ranks", "bytes", "count", "time_us",
                        "algbw_GBps", "busbw_GBps", "wrong");
        }
        auto row = [&](char const* op, char const* name, std::size_t bytes, std::size_t count, double us, double bus_factor,
                       double wrong_elements, rank_t ranks) {
            double const algbw = us > 0 ? static_cast<double>(bytes) / us / 1e3 : 0;
            if (me == 0)
                std::printf("%-16s %-20s %5d %12zu %10zu %12.2f %11.4f %11.4f %8.0f\n", op, name, ranks, bytes, count, us, algbw,
                            algbw * bus_factor, wrong_elements);
            std::fflush(stdout);
            if (wrong_elements != 0) all_right = false;
        };
        auto iterations = [&](std::size_t bytes) {
            auto const base = static_cast<int>(std::clamp<std::size_t>((std::size_t{256} << 20) / bytes, 3, 20));
            return std::max(3, static_cast<int>(base * iter_scale));
        };

        // The ceiling: device-to-device copies on rank 0's GPU, while the others wait.
        if (me == 0) {
            for (std::size_t bytes = begin; bytes <= end; bytes *= factor) {
                void *a = nullptr, *c = nullptr;
                cuda_ok(cudaMalloc(&a, bytes), "cudaMalloc");
                cuda_ok(cudaMalloc(&c, bytes), "cudaMalloc");
                cudaEvent_t e0, e1;
                cuda_ok(cudaEventCreate(&e0), "cudaEventCreate");
                cuda_ok(cudaEventCreate(&e1), "cudaEventCreate");
                std::vector<double> times;
                for (int it = 0; it < 2 + iterations(bytes); ++it) {
                    cuda_ok(cudaEventRecord(e0, cudaStreamPerThread), "cudaEventRecord");
                    cuda_ok(cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread), "cudaMemcpyAsync");
                    cuda_ok(cudaEventRecord(e1, cudaStreamPerThread), "cudaEventRecord");
                    cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
                    float ms = 0;
                    cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
                    if (it >= 2) times.push_back(ms * 1e3);
                }
                std::sort(times.begin(), times.end());
                row("ceiling", "memcpy_d2d", bytes, bytes / sizeof(float), times[times.size() / 2], 1, 0, 1);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                cudaFree(a);
                cudaFree(c);
            }
        }
        chorus::barrier(tp);

        bool const all_algos = algo == "all";
        for (std::string const& op : ops) {
            for (std::size_t bytes = begin; bytes <= end; bytes *= factor) {
                std::size_t const count = bytes / sizeof(float);
                int const iters = iterations(bytes);
                // Above one_shot's slot the automatic rows are zero_copy already (broadcast,
                // reduce_scatter, alltoall; allgather by its block): named rows only below it.
                bool const below_auto_zero_copy = bytes <= tp.direct_bytes();
                auto reset_wrong = [&] { cuda_ok(cudaMemset(wrong, 0, sizeof *wrong), "cudaMemset"); };
                if (op == "allreduce") {
                    // One pass per element type; a 16-bit type's rows name it after the algorithm.
                    auto rows_of = [&]<class T>(char const* suffix) {
                        std::size_t const n = bytes / sizeof(T);
                        T* d = nullptr;
                        cuda_ok(cudaMalloc(&d, n * sizeof(T)), "cudaMalloc");
                        auto run = [&]<class Algo>(char const* algo_name) {
                            std::string const name = std::string(algo_name) + suffix;
                            reset_wrong();
                            double const us = b.time(
                                2, iters, [&] { fill<<<chorus::detail::cuda_grid(n), chorus::detail::cuda_block>>>(d, n, me, 0); },
                                [&] { chorus::allreduce<Algo>(tp, std::span(d, n), chorus::sum{}); },
                                [&] { check<<<chorus::detail::cuda_grid(n), chorus::detail::cuda_block, 0, cudaStreamPerThread>>>(d, n, p, 0, 0, 0, wrong); });
                            row("allreduce", name.c_str(), bytes, n, us, 2.0 * static_cast<double>(p - 1) / static_cast<double>(p), b.total_wrong(), p);
                        };
                        run.template operator()<chorus::automatic>("auto");
                        if (all_algos) {
                            run.template operator()<chorus::ring>("ring");
                            run.template operator()<chorus::rabenseifner>("rabenseifner");
                            run.template operator()<chorus::two_shot>("two_shot");
                            {  // the vector registered (chorus/registration.hpp): no export or open per call
                                auto const reg = chorus::register_buffer(tp, std::span(d, n));
                                run.template operator()<chorus::two_shot>(reg.kept() ? "two_shot_registered" : "two_shot_unregistered");
                                chorus::deregister_buffer(tp, reg);
                            }
                            if (bytes <= (std::size_t{64} << 20)) {
                                run.template operator()<chorus::recursive_doubling>("recursive_doubling");
                                run.template operator()<chorus::tree>("tree");
                                run.template operator()<chorus::one_shot>("one_shot");
                            }
                        }
                        cudaFree(d);
                    };
                    for (std::string const& t : dtypes) {
                        if (t == "float") rows_of.template operator()<float>("");
                        else if (t == "half") rows_of.template operator()<__half>("_half");
                        else rows_of.template operator()<__nv_bfloat16>("_bf16");
                    }
                } else if (op == "allgather") {
                    std::size_t const block = count / P;
                    if (block == 0) continue;
                    float *in = nullptr, *out = nullptr;
                    cuda_ok(cudaMalloc(&in, block * sizeof(float)), "cudaMalloc");
                    cuda_ok(cudaMalloc(&out, block * P * sizeof(float)), "cudaMalloc");
                    auto run = [&]<class Algo>(char const* name) {
                        reset_wrong();
                        double const us = b.time(
                            2, iters,
                            [&] {
                                fill<<<chorus::detail::cuda_grid(block), chorus::detail::cuda_block>>>(in, block, me, 0);
                                fill_constant<<<chorus::detail::cuda_grid(block * P), chorus::detail::cuda_block>>>(out, block * P, -1.0f);
                            },
                            [&] { chorus::allgather<Algo>(tp, std::span(in, block), std::span(out, block * P)); },
                            [&] { check<<<chorus::detail::cuda_grid(block * P), chorus::detail::cuda_block, 0, cudaStreamPerThread>>>(out, block * P, p, 1, block, 0, wrong); });
                        row("allgather", name, block * P * sizeof(float), block * P, us,
                            static_cast<double>(p - 1) / static_cast<double>(p), b.total_wrong(), p);
                    };
                    run.template operator()<chorus::automatic>("auto");
                    if (all_algos) {
                        run.template operator()<chorus::ring>("ring");
                        run.template operator()<chorus::bruck>("bruck");
                        if (bytes <= (std::size_t{64} << 20)) run.template operator()<chorus::one_shot>("one_shot");
                        if (block * sizeof(float) <= tp.direct_bytes()) run.template operator()<chorus::zero_copy>("zero_copy");
                    }
                    cudaFree(in);
                    cudaFree(out);
                } else if (op == "broadcast") {
                    float* d = nullptr;
                    cuda_ok(cudaMalloc(&d, count * sizeof(float)), "cudaMalloc");
                    auto run = [&]<class Algo>(char const* name) {
                        reset_wrong();
                        double const us = b.time(
                            2, iters,
                            [&] {
                                if (me == 0) fill<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block>>>(d, count, 0, 0);
                                else fill_constant<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block>>>(d, count, -1.0f);
                            },
                            [&] { chorus::broadcast<Algo>(tp, std::span(d, count), 0); },
                            [&] { check<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block, 0, cudaStreamPerThread>>>(d, count, p, 2, 0, 0, wrong); });
                        row("broadcast", name, bytes, count, us, 1.0, b.total_wrong(), p);
                    };
                    run.template operator()<chorus::automatic>("auto");
                    if (all_algos) {
                        run.template operator()<chorus::tree>("tree");
                        run.template operator()<chorus::scatter_allgather>("scatter_allgather");
                        if (bytes <= (std::size_t{64} << 20)) run.template operator()<chorus::one_shot>("one_shot");
                        if (below_auto_zero_copy) run.template operator()<chorus::zero_copy>("zero_copy");
                    }
                    cudaFree(d);
                } else if (op == "reduce_scatter" || op == "alltoall" || op == "alltoallv") {
                    bool const scatter = op == "reduce_scatter";
                    std::size_t const block = count / P;
                    if (block == 0) continue;
                    float *in = nullptr, *out = nullptr;
                    std::size_t const out_count = scatter ? block : block * P;
                    cuda_ok(cudaMalloc(&in, block * P * sizeof(float)), "cudaMalloc");
                    cuda_ok(cudaMalloc(&out, out_count * sizeof(float)), "cudaMalloc");
                    auto run = [&](char const* name, auto call) {
                        reset_wrong();
                        double const us = b.time(
                            2, iters,
                            [&] {
                                fill<<<chorus::detail::cuda_grid(block * P), chorus::detail::cuda_block>>>(in, block * P, me, 0);
                                fill_constant<<<chorus::detail::cuda_grid(out_count), chorus::detail::cuda_block>>>(out, out_count, -1.0f);
                            },
                            call,
                            [&] {
                                check<<<chorus::detail::cuda_grid(out_count), chorus::detail::cuda_block, 0, cudaStreamPerThread>>>(
                                    out, out_count, p, scatter ? 3 : 4, scatter ? static_cast<std::size_t>(me) * block : block, me, wrong);
                            });
                        row(op.c_str(), name, block * P * sizeof(float), block * P, us, static_cast<double>(p - 1) / static_cast<double>(p),
                            b.total_wrong(), p);
                    };
                    std::span<float const> const send(in, block * P);
                    auto reduce_scatter = [&]<class Algo>(char const* name) {
                        run(name, [&] { chorus::reduce_scatter<Algo>(tp, send, std::span(out, block), chorus::sum{}); });
                    };
                    auto alltoall = [&]<class Algo>(char const* name) {
                        run(name, [&] { chorus::alltoall<Algo>(tp, send, std::span(out, block * P)); });
                    };
                    std::vector<std::size_t> const counts(P, block);  // alltoallv: alltoall's blocks
                    auto alltoallv = [&]<class Algo>(char const* name) {
                        run(name, [&] { chorus::alltoallv<Algo>(tp, send, counts, std::span(out, block * P), counts); });
                    };
                    bool const small = bytes <= (std::size_t{64} << 20);
                    if (scatter) {
                        reduce_scatter.template operator()<chorus::automatic>("auto");
                        if (all_algos) {
                            reduce_scatter.template operator()<chorus::ring>("ring");
                            reduce_scatter.template operator()<chorus::tree>("tree");
                            if (small) reduce_scatter.template operator()<chorus::one_shot>("one_shot");
                            if (below_auto_zero_copy) reduce_scatter.template operator()<chorus::zero_copy>("zero_copy");
                        }
                    } else if (op == "alltoallv") {
                        // The automatic row: zero_copy above one_shot's slot, pairwise below.
                        alltoallv.template operator()<chorus::automatic>("auto");
                        if (all_algos) alltoallv.template operator()<chorus::pairwise>("pairwise");
                    } else {
                        alltoall.template operator()<chorus::automatic>("auto");
                        if (all_algos) {
                            alltoall.template operator()<chorus::pairwise>("pairwise");
                            alltoall.template operator()<chorus::bruck>("bruck");
                            if (small) alltoall.template operator()<chorus::one_shot>("one_shot");
                            if (below_auto_zero_copy) alltoall.template operator()<chorus::zero_copy>("zero_copy");
                        }
                    }
                    cudaFree(in);
                    cudaFree(out);
                } else if (op == "sendrecv") {
                    float *in = nullptr, *out = nullptr;
                    cuda_ok(cudaMalloc(&in, count * sizeof(float)), "cudaMalloc");
                    cuda_ok(cudaMalloc(&out, count * sizeof(float)), "cudaMalloc");
                    rank_t const next = (me + 1) % p, prev = (me + p - 1) % p;
                    bool const rendezvous = p > 1 && tp.rendezvous_bytes() != 0 && bytes >= tp.rendezvous_bytes();
                    reset_wrong();
                    double const us = b.time(
                        2, iters,
                        [&] {
                            fill<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block>>>(out, count, me, 0);
                            fill_constant<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block>>>(in, count, -1.0f);
                        },
                        [&] { chorus::sendrecv(tp, next, std::span<float const>(out, count), prev, std::span(in, count), 5); },
                        [&] { check<<<chorus::detail::cuda_grid(count), chorus::detail::cuda_block, 0, cudaStreamPerThread>>>(in, count, p, 2, 0, prev, wrong); });
                    row("sendrecv", rendezvous ? "rendezvous" : "chunks", bytes, count, us, 1.0, b.total_wrong(), p);
                    cudaFree(in);
                    cudaFree(out);
                } else {
                    if (me == 0) std::fprintf(stderr, "cuda_bench: unknown op %s\n", op.c_str());
                    return 2;
                }
            }
        }
        chorus::barrier(tp);
        cudaFree(slot);
        cudaFree(wrong);
        return all_right ? 0 : 3;
    } catch (chorus::error const& e) {
        std::fprintf(stderr, "cuda_bench: %s\n", e.what());
        return 1;
    }
}
