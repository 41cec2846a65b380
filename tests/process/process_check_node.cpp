// SPDX-License-Identifier: MIT
// process_check's modes over node_transport: `node` takes the nodes from the environment,
// `node:K` cuts this host's ranks into K nodes of consecutive ranks, `node%K` puts rank r on
// node r % K.

#include "process_check.hpp"

#include <chorus/transport/node.hpp>

#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <utility>
#include <vector>

#include <sched.h>  // the affinity masks of the oversubscription check

// A group inside one node exchanges directly (the matrix's groups() checks it where it is one).
static_assert(chorus::rooted_transport<chorus::group_transport<chorus::node_transport>>);

int run_node(std::string const& transport, std::string const& mode, mode_args const& arg) {
    auto config = chorus::node_transport::config_from_env();
    if (transport.size() > 5) {  // node:K or node%K: K nodes on this host
        int const k = std::atoi(transport.c_str() + 5);
        int const r = config.tcp.rank, p = config.tcp.size;
        config.node = "node" + std::to_string(transport[4] == ':' ? r * k / p : r % k);
    }
    // PROCESS_CHECK_PIN: every rank on the first CPU it may run on, so that nodes of one rank
    // each still share a CPU (the oversubscription check below then tells a count of the node's
    // members from a count of the host's ranks on any machine).
    if (std::getenv("PROCESS_CHECK_PIN")) {
        cpu_set_t allowed, first;
        CPU_ZERO(&first);
        if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0)
            for (std::size_t c = 0; c < CPU_SETSIZE; ++c)
                if (CPU_ISSET(c, &allowed)) {
                    CPU_SET(c, &first);
                    break;
                }
        if (CPU_COUNT(&first) == 0 || ::sched_setaffinity(0, sizeof first, &first) != 0) {
            std::fprintf(stderr, "rank %d: PROCESS_CHECK_PIN: cannot pin this process to one CPU\n", config.tcp.rank);
            return 1;
        }
    }
    chorus::node_transport tp(std::move(config));
    std::printf("rank %d: node %d of %d, %d ranks on it\n", tp.rank(), tp.node(), tp.nodes(), tp.local_size());
    // Rings that cross hosts cut TCP's segments, rings inside one shared memory's: the whole
    // group where there are several nodes, a rail where it has several ranks (one per node; a
    // node larger than the others has rails of one), the node's own ranks never.
    std::size_t const tcp = chorus::detail::declared_ring_segment_bytes<chorus::tcp_transport>(),
                      shm = chorus::detail::declared_ring_segment_bytes<chorus::shm_transport>(), across = tp.nodes() > 1 ? tcp : shm;
    auto& h = tp.hierarchy();
    for (auto [what, got, want] : {std::tuple{"the group", chorus::detail::ring_segment_bytes_of(tp), across},
                                   std::tuple{"its node", chorus::detail::ring_segment_bytes_of(h.local()), shm},
                                   std::tuple{"its rail", chorus::detail::ring_segment_bytes_of(h.rail()), h.rail().size() > 1 ? tcp : shm}})
        if (got != want) {
            std::fprintf(stderr, "rank %d: the ring segment over %s is %zu bytes, not %zu\n", tp.rank(), what, got, want);
            return 1;
        }
    // Nodes named apart on this one host (node:K, node%K) share its CPUs: a wait yields at once
    // where all the group's ranks (not only the node's) outnumber the CPUs they may run on
    // together. The oracle unites every rank's affinity mask itself.
    if (transport.size() <= 5) return run(tp, mode, arg);
    cpu_set_t const mine = chorus::detail::shm::own_cpus();
    std::vector<cpu_set_t> masks(static_cast<std::size_t>(tp.size()));
    chorus::allgather(tp, std::span<cpu_set_t const>(&mine, 1), std::span<cpu_set_t>(masks));
    cpu_set_t together;
    CPU_ZERO(&together);
    for (cpu_set_t& m : masks) CPU_OR(&together, &together, &m);
    if (bool const want = tp.size() > CPU_COUNT(&together); tp.oversubscribed() != want) {
        std::fprintf(stderr, "rank %d: oversubscribed() is %d with %d ranks on %d CPUs\n", tp.rank(), tp.oversubscribed(), tp.size(),
                     CPU_COUNT(&together));
        return 1;
    }
    return run(tp, mode, arg);
}
