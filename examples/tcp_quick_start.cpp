// SPDX-License-Identifier: MIT
// The README's first process program: joins the job a launcher started and averages a
// gradient. README.md shows this file from its first #include on; a test checks that the two
// agree, and another runs it on 4 ranks.
//
// Usage: chorusrun -n 4 build/examples/tcp_quick_start
//
// Expected output (lines of different ranks may interleave):
//   [rank0] rank 0: 2.5
//   [rank1] rank 1: 2.5
//   [rank2] rank 2: 2.5
//   [rank3] rank 3: 2.5

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>   // target chorus::tcp_compiled (or chorus::tcp)
#include <cstdio>
#include <vector>

int main() {
    auto tp = chorus::tcp_transport::from_env();       // rendezvous, full mesh
    std::vector<float> grad{float(tp.rank() + 1)};
    chorus::allreduce(tp, grad, chorus::avg{});
    std::printf("rank %d: %g\n", tp.rank(), grad[0]);
}
