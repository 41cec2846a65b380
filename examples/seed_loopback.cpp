// SPDX-License-Identifier: MIT
// The seed article's collectives on 4 in-process ranks (loopback_transport), printing the
// article's values. No sockets, no launcher: the quickest way to see chorus work.
//
// Usage: build/examples/seed_loopback
//
// Expected output:
//   broadcast       [rank0] [1, 2, 3]  [rank1] [1, 2, 3]  [rank2] [1, 2, 3]  [rank3] [1, 2, 3]
//   scatter         [rank0] [10]  [rank1] [11]  [rank2] [12]  [rank3] [13]
//   gather          [rank0] [0, 1, 2, 3]
//   allgather       [rank0] [0, 1, 2, 3]  [rank1] [0, 1, 2, 3]  [rank2] [0, 1, 2, 3]  [rank3] [0, 1, 2, 3]
//   allreduce SUM   [rank0] [10]  [rank1] [10]  [rank2] [10]  [rank3] [10]
//   allreduce AVG   [rank0] [2.5]  [rank1] [2.5]  [rank2] [2.5]  [rank3] [2.5]
//   reduce_scatter  [rank0] [60]  [rank1] [64]  [rank2] [68]  [rank3] [72]
//   alltoall        [rank0] [0, 10, 20, 30]  [rank1] [1, 11, 21, 31]  [rank2] [2, 12, 22, 32]  [rank3] [3, 13, 23, 33]
//   alltoallv       [rank0] [0, 1, 1, 2, 2, 2, 3]  [rank1] [0, 0, 1, 1, 1, 2, 3, 3]  [rank2] [0, 0, 0, 1, 2, 2, 3, 3, 3]  [rank3] [0, 1, 1, 2, 2, 2, 3]

#include <chorus/chorus.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Rank threads record their results; main prints them in order, so output is stable.
class table {
public:
    void add(std::string const& row, int rank, std::vector<float> const& values) {
        std::ostringstream out;
        out << "[rank" << rank << "] [";
        for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
        out << "]";
        std::lock_guard lock(mutex_);
        rows_[row][rank] = out.str();
        if (std::find(order_.begin(), order_.end(), row) == order_.end()) order_.push_back(row);
    }
    void print() const {
        for (auto const& row : order_) {
            std::printf("%-15s", row.c_str());
            for (auto const& [rank, text] : rows_.at(row)) std::printf("  %s", text.c_str());
            std::printf("\n");
        }
    }

private:
    std::mutex mutex_;
    std::vector<std::string> order_;
    std::map<std::string, std::map<int, std::string>> rows_;
};

} // namespace

int main() {
    table out;
    chorus::run_ranks(4, [&](chorus::loopback_transport& tp) {
        int const rank = tp.rank(), world = tp.size();

        std::vector<float> t = rank == 0 ? std::vector<float>{1, 2, 3} : std::vector<float>(3, 0.0f);
        chorus::broadcast(tp, t, /*root=*/0);
        out.add("broadcast", rank, t);

        std::vector<float> list = rank == 0 ? std::vector<float>{10, 11, 12, 13} : std::vector<float>{};
        std::vector<float> piece(1);
        chorus::scatter(tp, list, piece, 0);
        out.add("scatter", rank, piece);

        std::vector<float> mine{float(rank)}, gathered(rank == 0 ? 4 : 0);
        chorus::gather(tp, mine, gathered, 0);
        if (rank == 0) out.add("gather", rank, gathered);

        std::vector<float> everyone(4);
        chorus::allgather(tp, mine, everyone);
        out.add("allgather", rank, everyone);

        std::vector<float> grad{float(rank + 1)}, avg = grad;
        chorus::allreduce(tp, grad, chorus::sum{});
        chorus::allreduce(tp, avg, chorus::avg{});
        out.add("allreduce SUM", rank, grad);
        out.add("allreduce AVG", rank, avg);

        std::vector<float> blocks(4), block(1);
        for (int j = 0; j < world; ++j) blocks[std::size_t(j)] = float(rank * 10 + j);
        chorus::reduce_scatter(tp, blocks, block, chorus::sum{});
        out.add("reduce_scatter", rank, block);

        std::vector<float> send(4), recv(4);
        for (int j = 0; j < world; ++j) send[std::size_t(j)] = float(j + rank * 10);
        chorus::alltoall(tp, send, recv);
        out.add("alltoall", rank, recv);

        std::vector<int> splits(4);
        for (int j = 0; j < world; ++j) splits[std::size_t(j)] = (rank + j) % 3 + 1;  // symmetric in rank and j
        int total = 0;
        for (int s : splits) total += s;
        std::vector<float> send_v(static_cast<std::size_t>(total), float(rank));
        std::vector<float> recv_v(static_cast<std::size_t>(total));
        chorus::alltoallv(tp, send_v, splits, recv_v, splits);
        out.add("alltoallv", rank, recv_v);
    });
    out.print();
}
