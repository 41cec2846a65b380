// SPDX-License-Identifier: MIT
// process_check's modes over shm_transport.

#include "process_check.hpp"

#include <chorus/transport/shm.hpp>

int run_shm(std::string const& mode, mode_args const& arg) {
    auto tp = chorus::shm_transport::from_env();
    return run(tp, mode, arg);
}
