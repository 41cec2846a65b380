// SPDX-License-Identifier: MIT
// process_check's main: picks the transport and the mode (process_check.hpp says what each does).

#include "process_check.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

int main(int argc, char** argv) {
    // process_check [--transport tcp|shm|node|node:K|node%K] MODE ARGS...
    std::string transport = "tcp";
    if (argc > 2 && std::string(argv[1]) == "--transport") {
        transport = argv[2];
        argc -= 2;
        argv += 2;
    }
    mode_args const arg{argc, argv};
    std::string const mode = argc > 1 ? argv[1] : "matrix";
    try {
        if (mode == "absent" && env_rank() == arg(2, 1)) {
            std::this_thread::sleep_for(std::chrono::minutes(10));  // chorusrun stops us
            return 0;
        }
        if (mode == "late" && env_rank() == arg(2, 1)) std::this_thread::sleep_for(std::chrono::milliseconds(arg(3, 1000)));

        if (transport == "shm") return run_shm(mode, arg);
        if (transport.starts_with("node")) return run_node(transport, mode, arg);
        return run_tcp(mode, arg);
    } catch (chorus::error const& e) {
        std::fprintf(stderr, "rank %d: error at %lld ms: %s\n", env_rank(), epoch_ms(), e.what());
        std::fprintf(stderr, "rank %d: peak RSS %ld MiB\n", env_rank(), peak_rss_mib());
        return 1;
    }
}
