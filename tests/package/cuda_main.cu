// SPDX-License-Identifier: MIT
// A consumer of chorus::cuda_ipc from the installed package (find_package(chorus COMPONENTS
// cuda_ipc)), run by the installed chorusrun: each rank's device buffer holds rank+1, so the
// sum over 2 ranks is 3. Without a usable GPU it says so and exits 77.
#include <cuda_runtime.h>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
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
        auto const check = [](cudaError_t e, char const* what) {
            if (e != cudaSuccess) throw chorus::device_error(std::string(what) + ": " + cudaGetErrorString(e));
        };
        int* raw = nullptr;
        check(cudaMalloc(&raw, v.size() * sizeof(int)), "cudaMalloc");
        struct device_free {
            void operator()(int* p) const noexcept { (void)cudaFree(p); }
        };
        std::unique_ptr<int, device_free> d(raw);
        check(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy");
        chorus::allreduce(gpu, std::span(d.get(), v.size()), chorus::sum{});
        gpu.synchronize();
        check(cudaMemcpy(v.data(), d.get(), v.size() * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
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
