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

#include <algorithm>
#include <chrono>

namespace chorus::detail {

class companion {
public:
    /// One non-blocking round of the other engine; may abort the poking engine.
    virtual void poke() = 0;
    /// Whether the other engine has operations in flight (a send not wholly written, a
    /// receive posted): then it is poked often, else only now and then.
    virtual bool busy() const noexcept = 0;

protected:
    ~companion() = default;
};

/// The longest an engine sleeps at once (a socket's ppoll, a ring's futex) while its companion
/// is busy: the companion is poked between sleeps, so a socket that has room again, or a ring
/// with the next part, waits at most this long. 500 us made an allgather of 16 MiB over
/// 2 hosts x 2 ranks 1.5x slower than 50 us (27-28 ms against 17-19 ms): its ring's TCP hop
/// stalled while its writer slept on shared memory. (Both at once would need one descriptor to
/// wait on: an eventfd per rank shared with pidfd_getfd — the next step if 50 us shows.)
inline constexpr std::chrono::microseconds companion_slice{50};
/// ... and while it is idle: often enough to notice a failure it would report.
inline constexpr std::chrono::milliseconds companion_idle_slice{10};

template <class Companion>
std::chrono::nanoseconds companion_sleep(Companion const* c, std::chrono::nanoseconds limit) noexcept {
    if (!c) return limit;
    return std::min<std::chrono::nanoseconds>(limit, c->busy() ? std::chrono::nanoseconds(companion_slice)
                                                                : std::chrono::nanoseconds(companion_idle_slice));
}

} // namespace chorus::detail
