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
//   process_check --transport shm groups       a sub-group's direct exchanges: a split whose
//                                              slots rank 1 cannot make fails on every rank,
//                                              then one that can runs one_shot; a group that
//                                              outlives its transport

#include "process_check.hpp"

#include "../support/registered_check.hpp"

#include <chorus/transport/shm.hpp>

#include <chorus/group.hpp>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

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

// A sub-group's direct exchanges (shm_engine::open_area): rank 1 cannot make its slots (its
// files are limited to 4 KiB), and every rank's split throws that, naming rank 1 — also the
// ranks of another group of the split, and a rank in none — the parent usable; once rank 1's
// files may grow again a split gets its slots and runs one_shot; a group that outlives its
// transport closes nothing when destroyed (AddressSanitizer: no use after free).
int groups() {
    std::optional<chorus::group_transport<chorus::shm_transport>> outliving;
    {
        auto tp = chorus::shm_transport::from_env();
        try {
            // No file over 4 KiB: its slots' memory file cannot be sized (EFBIG; SIGXFSZ ignored).
            // Not fewer descriptors: a sanitizer's own checks need some.
            rlimit old{};
            registered_check::require(::getrlimit(RLIMIT_FSIZE, &old) == 0, "getrlimit");
            if (tp.rank() == 1) {
                std::signal(SIGXFSZ, SIG_IGN);
                rlimit low = old;
                low.rlim_cur = 4096;
                registered_check::require(::setrlimit(RLIMIT_FSIZE, &low) == 0, "lowering RLIMIT_FSIZE");
            }
            // Three splits rank 1 cannot make slots for: one group of every rank; rank 1 alone
            // while ranks 0 and 2 make theirs (2 colors); ranks 1 and 2 while rank 0 joins none.
            for (int const shape : {0, 1, 2}) {
                int const color = shape == 0 ? 0 : shape == 1 ? tp.rank() % 2 : tp.rank() == 0 ? chorus::undefined_color : 1;
                std::string error;
                try {
                    auto refused = chorus::split(tp, color, -tp.rank());
                } catch (chorus::transport_error const& e) {
                    error = e.what();
                }
                registered_check::require(error.find("rank 1 could not join the direct exchanges of group") != std::string::npos,
                                          "split " + std::to_string(shape) + ", whose slots rank 1 could not make, did not say so: '" + error + "'");
            }
            if (tp.rank() == 1) registered_check::require(::setrlimit(RLIMIT_FSIZE, &old) == 0, "restoring RLIMIT_FSIZE");
            std::vector<int> v(5, 1);
            chorus::allreduce<chorus::one_shot>(tp, v);
            registered_check::require(v[4] == tp.size(), "the transport failed after a refused split");
            auto g = chorus::split(tp, tp.rank() % 2, -tp.rank());
            registered_check::require(g->direct_bytes() != 0, "a split once rank 1's files may grow again has no direct exchanges");
            std::vector<int> w(5, tp.rank());
            chorus::allreduce<chorus::one_shot>(*g, w);
            int want = 0;
            for (chorus::rank_t r : g->members()) want += r;
            registered_check::require(w[4] == want, "one_shot allreduce over a split: " + std::to_string(w[4]) + ", want " + std::to_string(want));
            outliving = chorus::split(tp, 0);
            chorus::barrier<chorus::one_shot>(*outliving);
        } catch (std::runtime_error const& e) {
            std::fprintf(stderr, "rank %d: wrong: %s\n", tp.rank(), e.what());
            return 2;
        }
        std::printf("rank %d: groups' direct exchanges right\n", tp.rank());
    }
    outliving.reset();  // after its transport
    return 0;
}

} // namespace

int run_shm(std::string const& mode, mode_args const& arg) {
    if (mode == "groups") return groups();
    auto tp = chorus::shm_transport::from_env();
    if (mode == "registered") return registered(tp);
    return run(tp, mode, arg);
}
