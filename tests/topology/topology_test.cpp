// SPDX-License-Identifier: MIT
// The topology concepts and the ring, binomial tree, binary tree and hypercube models.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>

#include <queue>
#include <set>
#include <vector>

#include "../support/archetypes.hpp"

using chorus::rank_t;

static_assert(chorus::topology<archetypes::topology> && !chorus::tree_topology<archetypes::topology>);
static_assert(chorus::tree_topology<archetypes::tree_topology>);
static_assert(chorus::tree_topology<chorus::binomial_tree> && chorus::tree_topology<chorus::binary_tree>);
static_assert(chorus::topology<chorus::ring_topology> && chorus::topology<chorus::hypercube>);
static_assert(!chorus::tree_topology<chorus::ring_topology>);
static_assert(!chorus::topology<int>);

// ---- topologies -------------------------------------------------------------------------

template <class Tree>
void check_spanning_tree(Tree const& tree, int max_depth) {
    rank_t const p = tree.size();
    CHECK(tree.parents(tree.root()).empty());
    std::vector<int> depth(static_cast<std::size_t>(p), -1);
    std::queue<rank_t> todo;
    depth[static_cast<std::size_t>(tree.root())] = 0;
    todo.push(tree.root());
    while (!todo.empty()) {
        rank_t const r = todo.front();
        todo.pop();
        for (rank_t c : tree.children(r)) {
            REQUIRE(c >= 0);
            REQUIRE(c < p);
            REQUIRE(depth[static_cast<std::size_t>(c)] == -1);  // no rank is reached twice
            auto const parents = tree.parents(c);
            REQUIRE(parents.size() == 1);
            CHECK(parents[0] == r);
            depth[static_cast<std::size_t>(c)] = depth[static_cast<std::size_t>(r)] + 1;
            todo.push(c);
        }
    }
    for (rank_t r = 0; r < p; ++r) {
        CHECK(depth[static_cast<std::size_t>(r)] >= 0);  // every rank is reached
        CHECK(depth[static_cast<std::size_t>(r)] <= max_depth);
    }
}

int ceil_log2(rank_t p) {
    int d = 0;
    while ((rank_t{1} << d) < p) ++d;
    return d;
}

TEST_CASE("binomial and binary trees span every rank count and root within their depth") {
    for (rank_t p = 1; p <= 33; ++p)
        for (rank_t root = 0; root < p; ++root) {
            CAPTURE(p);
            CAPTURE(root);
            check_spanning_tree(chorus::binomial_tree(p, root), ceil_log2(p));
            check_spanning_tree(chorus::binary_tree(p, root), ceil_log2(p + 1));
        }
}

TEST_CASE("binomial tree rooted at 0: children's subtrees are consecutive rank intervals") {
    for (rank_t p = 1; p <= 33; ++p) {
        chorus::binomial_tree const tree(p, 0);
        for (rank_t v = 0; v < p; ++v) {
            rank_t next = v + 1;  // own rank first, then each child's interval in order
            for (rank_t c : tree.children(v)) {
                CHECK(c == next);
                next += tree.subtree_size(c);
            }
            CHECK(next == v + tree.subtree_size(v));
        }
    }
}

TEST_CASE("hypercube: fold, core ranks and partners for every rank count") {
    for (rank_t p = 1; p <= 40; ++p) {
        chorus::hypercube const cube(p);
        rank_t const q = cube.core_size();
        CHECK((q & (q - 1)) == 0);
        CHECK(q <= p);
        CHECK(p < 2 * q);
        CHECK((rank_t{1} << cube.dimension()) == q);
        std::set<rank_t> cores;
        rank_t previous = -1;
        for (rank_t r = 0; r < p; ++r) {
            if (cube.is_folded(r)) {
                CHECK(cube.core_rank(r) == -1);
                CHECK(cube.fold_partner(cube.fold_partner(r)) == r);
                continue;
            }
            rank_t const c = cube.core_rank(r);
            CHECK(c > previous);  // monotone: rank order survives the fold
            previous = c;
            cores.insert(c);
            CHECK(cube.real_rank(c) == r);
            for (int s = 0; s < cube.dimension(); ++s) CHECK(cube.partner(cube.partner(r, s), s) == r);
        }
        CHECK(static_cast<rank_t>(cores.size()) == q);
    }
}

TEST_CASE("ring topology neighbours") {
    chorus::ring_topology const ring(5);
    CHECK(ring.right(4) == 0);
    CHECK(ring.left(0) == 4);
    CHECK(ring.neighbours(2).size() == 2);
    CHECK(chorus::ring_topology(2).neighbours(0).size() == 1);
    CHECK(chorus::ring_topology(1).neighbours(0).empty());
}
