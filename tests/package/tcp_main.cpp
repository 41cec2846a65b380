// SPDX-License-Identifier: MIT
// A consumer of chorus::tcp_compiled: its TU sees no Asio (CHORUS_TCP_SEPARATE_COMPILATION comes
// with the target), the engine is linked. 3 ranks as threads of this process over loopback TCP,
// rank 0 on a port the system picks; each contributes rank+1, so the sum is 1+2+3 = 6.
#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include <chorus/chorus.hpp>
#include <chorus/transport/tcp.hpp>

#if !defined(CHORUS_TCP_SEPARATE_COMPILATION)
#error "chorus::tcp_compiled must define CHORUS_TCP_SEPARATE_COMPILATION for its consumers"
#endif

int main() {
    constexpr int ranks = 3;
    std::promise<std::uint16_t> port_promise;
    std::shared_future<std::uint16_t> port = port_promise.get_future().share();
    std::vector<std::exception_ptr> errors(ranks);
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
                std::vector<double> v{double(r + 1), 0.5};
                chorus::allreduce(tp, v, chorus::sum{});
                if (v[0] != 6.0 || v[1] != 1.5) throw std::runtime_error("wrong sum");
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
    std::puts("tcp ok");
    return 0;
}
