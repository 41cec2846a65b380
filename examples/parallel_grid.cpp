// SPDX-License-Identifier: MIT
// Data x tensor parallelism on a 2 x 2 grid, the shape of a training step. chorus::split makes
// the groups over the job's connections: a row {2d, 2d+1} shares one model's shards (tensor
// parallel), a column {t, t+2} holds replicas of the same shard (data parallel).
//  - tensor parallel: the row's ranks hold uneven shards of an activation (row rank t holds t+1
//    values, rank r's values r*10 + k); allgatherv puts the whole activation on both;
//  - data parallel: the column averages its gradients with iallreduce while the rank computes,
//    calling test() between steps of work so the allreduce moves on, as a training loop overlaps
//    the gradient sync of one layer with the backward pass of the next;
//  - the job: each rank has r + 2 tokens to write to a shared file; exscan gives its offset and
//    scan the end of its range.
// Usage: chorusrun -n 4 build/examples/parallel_grid   (any even number of ranks)
//
// Expected output (lines of different ranks may interleave):
//   [rank0] row 0 (tensor) rank 0 of 2, column 0 (data) rank 0 of 2
//   [rank1] row 0 (tensor) rank 1 of 2, column 1 (data) rank 0 of 2
//   [rank2] row 1 (tensor) rank 0 of 2, column 0 (data) rank 1 of 2
//   [rank3] row 1 (tensor) rank 1 of 2, column 1 (data) rank 1 of 2
//   [rank0] activation (allgatherv over the row) = [0, 10, 11]
//   [rank1] activation (allgatherv over the row) = [0, 10, 11]
//   [rank2] activation (allgatherv over the row) = [20, 30, 31]
//   [rank3] activation (allgatherv over the row) = [20, 30, 31]
//   [rank0] gradient (iallreduce AVG over the column, overlapped) = [2.0, 4.0]
//   [rank1] gradient (iallreduce AVG over the column, overlapped) = [3.0, 6.0]
//   [rank2] gradient (iallreduce AVG over the column, overlapped) = [2.0, 4.0]
//   [rank3] gradient (iallreduce AVG over the column, overlapped) = [3.0, 6.0]
//   [rank0] 2 tokens at offset 0 (exscan), range ends at 2 (scan)
//   [rank1] 3 tokens at offset 2 (exscan), range ends at 5 (scan)
//   [rank2] 4 tokens at offset 5 (exscan), range ends at 9 (scan)
//   [rank3] 5 tokens at offset 9 (exscan), range ends at 14 (scan)

#include "example_util.hpp"
#include <cmath>
#include <iostream>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

namespace {

// Work between the test() calls: a few microseconds of arithmetic.
double compute_step(int step) {
    double x = 0;
    for (int i = 1; i < 20000; ++i) x += std::sqrt(static_cast<double>(i + step));
    return x;
}

int run(auto& tp) {
    int const r = tp.rank(), p = tp.size();
    if (p % 2 != 0) {
        std::cerr << "parallel_grid needs an even number of ranks" << std::endl;
        return 2;
    }
    auto row = chorus::split(tp, r / 2);  // key: the rank in tp, so row rank = r % 2
    auto column = chorus::split(tp, r % 2);
    std::cout << "row " << r / 2 << " (tensor) rank " << row->rank() << " of " << row->size() << ", column " << r % 2
              << " (data) rank " << column->rank() << " of " << column->size() << std::endl;

    // Tensor parallel: uneven shards, gathered on both ranks of the row.
    std::vector<int> const counts{1, 2};
    std::vector<int> shard;
    for (int k = 0; k <= row->rank(); ++k) shard.push_back(r * 10 + k);
    std::vector<int> activation(3);
    chorus::allgatherv(*row, shard, activation, counts);
    std::cout << "activation (allgatherv over the row) = " << example::format_list(activation) << std::endl;

    // Data parallel: the gradient average runs while this rank computes.
    std::vector<float> grad{static_cast<float>(r + 1), static_cast<float>(2 * (r + 1))};
    auto sync = chorus::iallreduce(*column, grad, chorus::avg{});
    double work = 0;
    for (int step = 0; !sync.test(); ++step) work += compute_step(step);
    sync.wait();
    std::cout << "gradient (iallreduce AVG over the column, overlapped) = " << example::format_list(grad) << std::endl;

    // The job: where this rank's tokens go in a shared file.
    std::vector<int> const tokens{r + 2};
    std::vector<int> offset{0}, end{0};
    chorus::exscan(tp, tokens, offset);  // rank 0's stays 0
    chorus::scan(tp, tokens, end);
    std::cout << tokens[0] << " tokens at offset " << offset[0] << " (exscan), range ends at " << end[0] << " (scan)"
              << std::endl;

    // The closed forms, for any even p.
    int const first = r / 2 * 2;
    std::vector<int> want_activation{first * 10, (first + 1) * 10, (first + 1) * 10 + 1};
    float column_mean = 0;
    for (int k = r % 2; k < p; k += 2) column_mean += static_cast<float>(k + 1);
    column_mean /= static_cast<float>(p / 2);
    int below = 0;
    for (int k = 0; k < r; ++k) below += k + 2;
    bool ok = example::check("allgatherv", r, activation, want_activation);
    ok = example::check("iallreduce", r, grad, std::vector<float>{column_mean, 2 * column_mean}) && ok;
    ok = example::check("exscan", r, offset, std::vector<int>{below}) && ok;
    ok = example::check("scan", r, end, std::vector<int>{below + r + 2}) && ok;
    return ok && work >= 0 ? 0 : 1;
}

} // namespace

int main() { return example::run_rank([](auto& tp) { return run(tp); }); }
