// SPDX-License-Identifier: MIT
// Misuse that must not compile, each with our own message (ctest matches it). One section per
// test, selected with -DSECTION_<name>; without a section the file compiles, which proves the
// failures below come from the misuse and not from the file.
#include <chorus/chorus.hpp>

#include <span>
#include <vector>

void use(chorus::loopback_transport& tp) {
    std::vector<int> v(4);
    auto concat = [](int a, int b) { return a * 10 + b; };  // associative-ish, not commutative
#if defined(SECTION_RING_NONCOMMUTATIVE)
    chorus::ring_allreduce(tp, std::span<int>(v), concat);
#elif defined(SECTION_FRONT_DOOR_RING_NONCOMMUTATIVE)
    chorus::allreduce<chorus::ring>(tp, v, concat);
#elif defined(SECTION_UNSUPPORTED_ALGORITHM)
    chorus::broadcast<chorus::rabenseifner>(tp, v, 0);
#elif defined(SECTION_OP_WITHOUT_PLUS)
    struct point {
        int x, y;
    };
    std::vector<point> points(4);
    chorus::allreduce(tp, points, chorus::sum{});
#elif defined(SECTION_ONE_SHOT_WITHOUT_DIRECT)
    // Threads of one process share memory, but loopback_transport is no direct_transport.
    chorus::allreduce<chorus::one_shot>(tp, v);
#elif defined(SECTION_NONBLOCKING_TEMPORARY)
    // The collective would outlive the vector: a nonblocking collective takes no temporaries.
    auto r = chorus::iallreduce(tp, std::vector<int>(4));
#else
    chorus::allreduce<chorus::tree>(tp, v, concat);
    auto r = chorus::iallreduce(tp, v);  // an lvalue: fine
    r.wait();
#endif
}

int main() {}
