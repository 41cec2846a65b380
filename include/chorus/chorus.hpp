// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The core of chorus: concepts, reduce ops, topologies, the loopback transport, the
// point-to-point and collective front doors and every algorithm. Transports with external
// dependencies are opt-in: <chorus/transport/tcp.hpp> (Asio), <chorus/transport/cuda_ipc.hpp>.

#include <chorus/collectives.hpp>
#include <chorus/concepts.hpp>
#include <chorus/config.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/group.hpp>
#include <chorus/memory.hpp>
#include <chorus/nonblocking.hpp>
#include <chorus/point_to_point.hpp>
#include <chorus/reduce/ops.hpp>
#include <chorus/registration.hpp>
#include <chorus/topology/binary_tree.hpp>
#include <chorus/topology/binomial_tree.hpp>
#include <chorus/topology/hypercube.hpp>
#include <chorus/topology/ring.hpp>
#include <chorus/transport/loopback.hpp>
#include <chorus/version.hpp>
