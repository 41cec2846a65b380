// SPDX-License-Identifier: MIT
// process_check's modes over node_transport: `node` takes the nodes from the environment,
// `node:K` cuts this host's ranks into K nodes of consecutive ranks, `node%K` puts rank r on
// node r % K.

#include "process_check.hpp"

#include <chorus/transport/node.hpp>

#include <cstdio>
#include <cstdlib>
#include <utility>

int run_node(std::string const& transport, std::string const& mode, mode_args const& arg) {
    auto config = chorus::node_transport::config_from_env();
    if (transport.size() > 5) {  // node:K or node%K: K nodes on this host
        int const k = std::atoi(transport.c_str() + 5);
        int const r = config.tcp.rank, p = config.tcp.size;
        config.node = "node" + std::to_string(transport[4] == ':' ? r * k / p : r % k);
    }
    chorus::node_transport tp(std::move(config));
    std::printf("rank %d: node %d of %d, %d ranks on it\n", tp.rank(), tp.node(), tp.nodes(), tp.local_size());
    return run(tp, mode, arg);
}
