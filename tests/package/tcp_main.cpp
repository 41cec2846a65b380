// SPDX-License-Identifier: MIT
// A consumer of chorus::tcp_compiled: its TU sees no Asio (CHORUS_TCP_SEPARATE_COMPILATION comes
// with the target), the engine is linked. 4 ranks as threads of this process over loopback TCP,
// rank 0 on a port the system picks, run the newer collectives through the installed headers:
// a split into rows {0,1} {2,3}, a nonblocking allreduce over the world and one over the row in
// flight together, an allgatherv with counts 1,2,3,4, and a scan. Each rank prints its results
// and checks them against the closed forms.
#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

#if !defined(CHORUS_TCP_SEPARATE_COMPILATION)
#error "chorus::tcp_compiled must define CHORUS_TCP_SEPARATE_COMPILATION for its consumers"
#endif

namespace {

constexpr int ranks = 4;

std::string run(chorus::tcp_transport& tp) {
    int const r = tp.rank();
    auto row = chorus::split(tp, r / 2, r);
    std::vector<double> world{double(r + 1), 0.5};
    std::vector<int> in_row{r};
    auto a = chorus::iallreduce(tp, world);
    auto b = chorus::iallreduce(*row, in_row);
    b.wait();
    a.wait();
    std::vector<int> counts{1, 2, 3, 4}, mine(std::size_t(r + 1), r * 10), all(10, -1);
    chorus::allgatherv(tp, mine, all, counts);
    std::vector<int> prefix{r + 1};
    chorus::scan(tp, prefix);

    // The closed forms: sums 1+2+3+4 and 4 * 0.5, the row's ranks, rank k repeated k+1 times,
    // 1 + 2 + ... + (r+1).
    int const row_sum = r < 2 ? 0 + 1 : 2 + 3;
    std::vector<int> gathered;
    for (int k = 0; k < ranks; ++k) gathered.insert(gathered.end(), std::size_t(k + 1), k * 10);
    bool const ok = world[0] == 10.0 && world[1] == 2.0 && in_row[0] == row_sum && all == gathered &&
                    prefix[0] == (r + 1) * (r + 2) / 2;
    std::string line = "rank " + std::to_string(r) + ": allreduce " + std::to_string(int(world[0])) + " row " +
                       std::to_string(in_row[0]) + " scan " + std::to_string(prefix[0]) + " allgatherv";
    for (int x : all) line += " " + std::to_string(x);
    if (!ok) throw std::runtime_error(line + " -- wrong");
    return line;
}

} // namespace

int main() {
    std::promise<std::uint16_t> port_promise;
    std::shared_future<std::uint16_t> port = port_promise.get_future().share();
    std::vector<std::exception_ptr> errors(ranks);
    std::vector<std::string> lines(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
            try {
                chorus::tcp_config c;
                c.rank = r;
                c.size = ranks;
                c.timeout = std::chrono::seconds(20);
                if (r == 0) {
                    c.on_master_listening = [&](std::uint16_t p) { port_promise.set_value(p); };
                } else {
                    if (port.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
                        throw std::runtime_error("rank 0 never listened");
                    c.master_port = port.get();
                }
                chorus::tcp_transport tp(std::move(c));
                lines[std::size_t(r)] = run(tp);
            } catch (...) {
                errors[std::size_t(r)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (auto const& e : errors) {
        if (!e) continue;
        try {
            std::rethrow_exception(e);
        } catch (std::exception const& x) {
            std::fprintf(stderr, "tcp consumer: %s\n", x.what());
        }
        return 1;
    }
    for (auto const& line : lines) std::puts(line.c_str());
    std::puts("tcp ok");
    return 0;
}
