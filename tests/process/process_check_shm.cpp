// SPDX-License-Identifier: MIT
// process_check's modes over shm_transport, and one of its own:
//
//   process_check --transport shm registered   the collectives on registered shm_buffers, each
//                                              rank's buffer read where it lies by the other
//                                              processes (support/registered_check.hpp), at
//                                              0, 1, p - 1, p + 1 and 50001 elements per block,
//                                              and 2^21 + 1 at 2 ranks (ctest runs that with
//                                              CHORUS_NT_COPY_BYTES=1 MiB: the copies stream); first, a registration that rank 1
//                                              cannot map (no descriptor left to open its
//                                              peers' memory with) is kept by no rank

#include "process_check.hpp"

#include "../support/registered_check.hpp"

#include <chorus/transport/shm.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace {

// Rank 1 cannot open a descriptor while it registers (its limit lowered to the lowest free
// one): its mapping of the peers' memory fails, and every rank must learn it in the round
// after, keep nothing, and go on.
void refused_registration(chorus::shm_transport& tp) {
    chorus::shm_buffer memory(1 << 20);
    rlimit old{};
    registered_check::require(::getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
    if (tp.rank() == 1) {
        int const lowest = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        registered_check::require(lowest >= 0, "opening /dev/null");
        ::close(lowest);
        rlimit low = old;
        low.rlim_cur = static_cast<rlim_t>(lowest);
        registered_check::require(::setrlimit(RLIMIT_NOFILE, &low) == 0, "lowering RLIMIT_NOFILE");
    }
    auto const reg = chorus::register_buffer(tp, memory.as<float>());
    if (tp.rank() == 1) registered_check::require(::setrlimit(RLIMIT_NOFILE, &old) == 0, "restoring RLIMIT_NOFILE");
    registered_check::require(!reg.kept() && !tp.exposes(), "a registration rank 1 could not map was kept");
    chorus::deregister_buffer(tp, reg);
    // With descriptors again, the same buffer registers: the refusal came from the missing one.
    auto const again = chorus::register_buffer(tp, memory.as<float>());
    registered_check::require(again.kept(), "the same buffer, registered with descriptors to spare, was not kept");
    chorus::deregister_buffer(tp, again);
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
