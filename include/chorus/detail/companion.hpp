// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// An engine that another engine drives while it waits. node_transport joins two engines in one
// rank: shared memory to the ranks of its host, TCP to the others. A rank that waits on one of
// them must keep the other moving — the rest of a message half written to a socket goes out
// only when its writer drives that socket, the next part of a message through a ring only when
// its writer refills the ring — or two hosts can wait on each other for ever. And it must hear
// of a failure the other engine finds (a peer's process died, a peer's abort frame arrived).
// So each engine's wait loop pokes the other: one non-blocking round of it, after which the
// poker's owner spreads the other's failure, if any, into the waiting engine (whose wait then
// throws it).

#include <chrono>

namespace chorus::detail {

class companion {
public:
    /// One non-blocking round of the other engine; may abort the poking engine.
    virtual void poke() = 0;

protected:
    ~companion() = default;
};

/// The longest an engine with a companion sleeps at once (a socket's ppoll, a ring's futex):
/// the companion is poked between sleeps, so it is never left alone longer.
inline constexpr std::chrono::microseconds companion_slice{500};

} // namespace chorus::detail
