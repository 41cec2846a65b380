// SPDX-License-Identifier: MIT
// process_check's modes over tcp_transport.

#include "process_check.hpp"

#include <chorus/transport/tcp.hpp>

int run_tcp(std::string const& mode, mode_args const& arg) {
    auto tp = chorus::tcp_transport::from_env();
    return run(tp, mode, arg);
}
