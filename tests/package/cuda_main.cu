// SPDX-License-Identifier: MIT
// A consumer of chorus::cuda_ipc from the installed package (find_package(chorus COMPONENTS
// cuda_ipc)), run by the installed chorusrun: each rank's device buffer holds rank+1, so the
// sum over 2 ranks is 3. Without a usable GPU it says so and exits 77.
#include <cuda_runtime.h>
#include <cstdio>
#include <span>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/cuda_ipc.hpp>

int main() {
    int devices = 0;
    if (cudaError_t const e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
        std::printf("cuda consumer: no usable CUDA device (%s)\n", e == cudaSuccess ? "none visible" : cudaGetErrorName(e));
        return 77;
    }
    try {
        auto gpu = chorus::cuda_ipc_transport::from_env();
        std::vector<int> v(1000, gpu.rank() + 1);
        int* d = nullptr;
        if (cudaMalloc(&d, v.size() * sizeof(int)) != cudaSuccess) throw chorus::device_error("cudaMalloc failed");
        cudaMemcpy(d, v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice);
        chorus::allreduce(gpu, std::span(d, v.size()), chorus::sum{});
        gpu.synchronize();
        cudaMemcpy(v.data(), d, v.size() * sizeof(int), cudaMemcpyDeviceToHost);
        cudaFree(d);
        int const want = gpu.size() * (gpu.size() + 1) / 2;
        for (int x : v)
            if (x != want) {
                std::fprintf(stderr, "cuda consumer: %d, expected %d\n", x, want);
                return 1;
            }
    } catch (std::exception const& e) {
        std::fprintf(stderr, "cuda consumer: %s\n", e.what());
        return 1;
    }
    std::puts("cuda ok");
    return 0;
}
