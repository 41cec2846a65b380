// SPDX-License-Identifier: MIT
// process_check's modes over shm_transport, and one of its own:
//
//   process_check --transport shm registered   the collectives on registered shm_buffers, each
//                                              rank's buffer read where it lies by the other
//                                              processes (support/registered_check.hpp), at
//                                              0, 1, p - 1, p + 1 and 50001 elements per block,
//                                              and 2^21 + 1 (past the streaming-copy threshold)
//                                              at 2 ranks; first, a registration that rank 1
//                                              cannot map (no descriptor left to open its
//                                              peers' memory with) is kept by no rank

#include "process_check.hpp"

#include "../support/registered_check.hpp"

#include <chorus/transport/shm.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include <sys/resource.h>
#include <unistd.h>

namespace {

// Rank 1 cannot open a descriptor while it registers (its limit lowered to the lowest free
// one): its mapping of the peers' memory fails, and every rank must learn it in the round
// after, keep nothing, and go on.
void refused_registration(chorus::shm_transport& tp) {
    chorus::shm_buffer memory(1 << 20);
    rlimit old{};
    ::getrlimit(RLIMIT_NOFILE, &old);
    if (tp.rank() == 1) {
        int const lowest = ::dup(0);
        ::close(lowest);
        rlimit low = old;
        low.rlim_cur = static_cast<rlim_t>(lowest);
        ::setrlimit(RLIMIT_NOFILE, &low);
    }
    auto const reg = chorus::register_buffer(tp, memory.as<float>());
    if (tp.rank() == 1) ::setrlimit(RLIMIT_NOFILE, &old);
    registered_check::require(!reg.kept() && !tp.exposes(), "a registration rank 1 could not map was kept");
    chorus::deregister_buffer(tp, reg);
    std::vector<float> v(1000, 1.0f);
    chorus::allreduce(tp, v);
    registered_check::require(v[999] == static_cast<float>(tp.size()), "the group failed after a refused registration");
}

int registered(chorus::shm_transport& tp) {
    auto const p = static_cast<std::size_t>(tp.size());
    try {
        if (p > 1) refused_registration(tp);
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, p - 1, p + 1, std::size_t{50001}}) {
            registered_check::run<double>(tp, n);
            registered_check::run<float>(tp, n);
            registered_check::run<std::int32_t>(tp, n);
        }
        if (p <= 2) registered_check::run<double>(tp, (std::size_t{1} << 21) + 1);
    } catch (std::runtime_error const& e) {
        std::fprintf(stderr, "rank %d: wrong: %s\n", tp.rank(), e.what());
        return 2;
    }
    std::printf("rank %d: registered collectives right, %llu rounds read where they lie\n", tp.rank(),
                static_cast<unsigned long long>(tp.exposed_rounds()));
    return 0;
}

} // namespace

int run_shm(std::string const& mode, mode_args const& arg) {
    auto tp = chorus::shm_transport::from_env();
    if (mode == "registered") return registered(tp);
    return run(tp, mode, arg);
}
