// SPDX-License-Identifier: MIT
// allreduce on GPU memory: the seed's gradient sync, written once as a template over the
// transport and instantiated twice at compile time — with tcp_transport on a host vector,
// then with cuda_ipc_transport on a device buffer (the same chorus::allreduce template; the
// transport's memory space decides that scratch lives on the GPU and a kernel reduces). The
// CUDA transport reuses the TCP group as its control channel, so there is one rendezvous.
// Rank r holds the gradient [r + 1, r + 1, r + 1]; SUM gives 1 + ... + p, AVG (p + 1) / 2.
//
// Usage: chorusrun -n 2 build/examples/allreduce_cuda_ipc      (ranks share the node's GPUs)
// Without a usable GPU it says so and exits 77 (the tests count that as skipped).
//
// Expected output (lines of different ranks may interleave):
//   [rank0] host (tcp_transport): SUM = [3.0, 3.0, 3.0]  AVG = [1.5, 1.5, 1.5]
//   [rank1] host (tcp_transport): SUM = [3.0, 3.0, 3.0]  AVG = [1.5, 1.5, 1.5]
//   [rank0] device (cuda_ipc_transport): SUM = [3.0, 3.0, 3.0]  AVG = [1.5, 1.5, 1.5]
//   [rank1] device (cuda_ipc_transport): SUM = [3.0, 3.0, 3.0]  AVG = [1.5, 1.5, 1.5]

#include "example_util.hpp"
#include <cuda_runtime.h>
#include <iostream>
#include <span>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/cuda_ipc.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

/// The user's code: any transport, any contiguous buffer in that transport's memory.
template <chorus::transport Transport, class Buffer>
void sync_gradients(Transport& tp, Buffer&& sum, Buffer&& mean) {
    chorus::allreduce(tp, sum, chorus::sum{});
    chorus::allreduce(tp, mean, chorus::avg{});
}

void cuda_or_die(cudaError_t e, char const* what) {
    if (e != cudaSuccess) throw chorus::device_error(std::string(what) + ": " + cudaGetErrorString(e));
}

int run(chorus::tcp_transport& host) {
    auto const world = static_cast<float>(host.size());
    std::vector<float> const grad(3, static_cast<float>(host.rank() + 1));
    std::vector<float> const want_sum(3, world * (world + 1.0f) / 2.0f), want_avg(3, (world + 1.0f) / 2.0f);

    std::vector<float> sum = grad, mean = grad;
    sync_gradients(host, sum, mean);  // Transport = tcp_transport, Buffer = std::vector<float>&
    std::cout << "host (tcp_transport): SUM = " << example::format_list(sum) << "  AVG = " << example::format_list(mean)
              << std::endl;
    bool ok = example::check("host SUM", host.rank(), sum, want_sum) && example::check("host AVG", host.rank(), mean, want_avg);

    chorus::cuda_ipc_transport gpu(std::move(host));
    float *d_sum = nullptr, *d_mean = nullptr;
    cuda_or_die(cudaMalloc(&d_sum, 3 * sizeof(float)), "cudaMalloc");
    cuda_or_die(cudaMalloc(&d_mean, 3 * sizeof(float)), "cudaMalloc");
    cuda_or_die(cudaMemcpy(d_sum, grad.data(), 3 * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_or_die(cudaMemcpy(d_mean, grad.data(), 3 * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    sync_gradients(gpu, std::span(d_sum, 3), std::span(d_mean, 3));  // cuda_ipc_transport, std::span<float>
    gpu.synchronize();
    cuda_or_die(cudaMemcpy(sum.data(), d_sum, 3 * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda_or_die(cudaMemcpy(mean.data(), d_mean, 3 * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    cudaFree(d_sum);
    cudaFree(d_mean);
    std::cout << "device (cuda_ipc_transport): SUM = " << example::format_list(sum) << "  AVG = " << example::format_list(mean)
              << std::endl;
    ok = example::check("device SUM", gpu.rank(), sum, want_sum) && example::check("device AVG", gpu.rank(), mean, want_avg) && ok;
    chorus::barrier(gpu);
    return ok ? 0 : 1;
}

} // namespace

int main() {
    int devices = 0;
    if (cudaError_t const e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
        std::cout << "allreduce_cuda_ipc: no usable CUDA device (" << (e == cudaSuccess ? "none visible" : cudaGetErrorName(e))
                  << "): skipped" << std::endl;
        return 77;
    }
    return example::run_rank(run);
}
