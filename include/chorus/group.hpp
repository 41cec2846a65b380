// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Sub-groups: a transport of a subset of a transport's ranks, over the parent's connections
// (no new sockets, no new rendezvous), for data x tensor parallel grids and the like.
//
//   auto row = chorus::split(tp, /*color=*/tp.rank() / 2, /*key=*/tp.rank());  // MPI_Comm_split
//   auto evens = chorus::group(tp, std::vector{0, 2});                          // torch new_group
//   if (row) chorus::allreduce(*row, grads);
//
// Both are collectives of the parent: every rank of the parent calls them, in the same order
// as its other collectives. A group_transport is a transport like any other (every collective
// and point-to-point front door takes it), with ranks 0 .. size()-1 of its own.
//
// Its messages are told apart from the parent's and from other groups' by a group number in
// their tags (detail/tags.hpp: bits 36-55). The number is agreed in the call: every rank
// contributes the highest number its process has handed out, and the group takes one more
// than the largest. Two groups that share two ranks thus never share a number: both ranks
// took part in creating both, the later one seeing the earlier one's number (groups from one
// split with different colors share a number, but no rank). A group's own collective
// sequence and user tags take the low 36 bits (user tags below 2^36).
//
// Direct exchanges: where the parent gives its groups slots of their own (shm_transport; a
// node_transport for a group inside one node: Parent::direct_group, open_direct_group), the
// group is a direct_transport and its small collectives run one_shot. Opening them takes two
// allgathers over the new group (its collectives #0 and #1) and one over the parent (whether
// every group could); docs/algorithms.md, "Sub-groups".
//
// Failure: a group has its parent's failure contract. abort() on a group fails the whole
// parent group (its connections are the parent's), and errors name the parent's ranks, with
// the group's number in the collective's name ("allreduce #3 of group 2").
// The parent must outlive its groups; a group of a group is a group of the same parent.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <chorus/algorithm/detail/collective.hpp>
#include <chorus/collectives.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/ranges.hpp>
#include <chorus/transport/concepts.hpp>

namespace chorus {

namespace detail {
/// What a sub-group of `Parent` exchanges directly through (Parent::direct_group; void: none).
template <class Parent>
struct direct_group_of {
    using type = void;
};
template <class Parent>
    requires requires { typename Parent::direct_group; }
struct direct_group_of<Parent> {
    using type = typename Parent::direct_group;
};
/// Whether sub-groups of `Parent` are direct_transports: the parent opens slots of their own
/// for them (shm_transport::open_direct_group).
template <class Parent>
concept gives_direct_groups = !std::is_void_v<typename direct_group_of<Parent>::type>;
} // namespace detail

/// The color that puts a rank in no group of a split (MPI_UNDEFINED).
inline constexpr int undefined_color = -1;

/// The ranks `members` (ranks of `Parent`) as a transport of their own; this rank is
/// `members[rank()]`. Made by chorus::split and chorus::group.
template <transport Parent>
class group_transport {
public:
    using memory_space = typename Parent::memory_space;
    using request = typename Parent::request;
    using parent_type = Parent;

    /// The largest user tag a group carries (its tags share the parent's tag space).
    static constexpr tag_t max_user_tag = detail::group_sequence_mask;

    group_transport(Parent& parent, std::vector<rank_t> members, rank_t rank, std::uint64_t number)
        : parent_(&parent), members_(std::move(members)), rank_(rank), number_(number) {}

    rank_t rank() const noexcept { return rank_; }
    rank_t size() const noexcept { return static_cast<rank_t>(members_.size()); }
    /// The group's number in its messages' tags (1, 2, ...).
    std::uint64_t number() const noexcept { return number_; }
    /// The parent's rank of group rank `r`.
    rank_t parent_rank(rank_t r) const noexcept { return members_[static_cast<std::size_t>(r)]; }
    std::span<rank_t const> members() const noexcept { return members_; }
    Parent& parent() noexcept { return *parent_; }
    std::chrono::milliseconds timeout() const noexcept
        requires requires(Parent const& p) { p.timeout(); }
    {
        return parent_->timeout();
    }

    /// The ring allreduce's segment over this group (detail::ring_segment_bytes_of): what the
    /// parent asks for these ranks where it depends on them (node_transport: a group inside one
    /// host rings through memory, one across hosts over TCP), else what it asks for its own.
    std::size_t ring_segment_bytes() const noexcept {
        if constexpr (requires(Parent const& p, std::span<rank_t const> m) {
                          { p.ring_segment_bytes(m) } -> std::convertible_to<std::size_t>;
                      })
            return parent_->ring_segment_bytes(std::span<rank_t const>(members_));
        else return detail::ring_segment_bytes_of(*parent_);
    }

    // direct_transport and rooted_transport where the parent gives its sub-groups direct
    // exchanges of their own (detail::gives_direct_groups: shm_transport, node_transport), opened when split or
    // group made this one: its small collectives then take the one_shot schedules. Their rounds
    // carry the parent's tags (the group's number in them), so that a mismatch between one
    // rank's round and another's messages is found as in the parent (shm/engine.hpp).
    std::size_t direct_bytes() const noexcept
        requires detail::gives_direct_groups<Parent>
    {
        return direct_ ? direct_->direct_bytes() : 0;
    }
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag)
        requires detail::gives_direct_groups<Parent>
    {
        exchange(pieces, agreed, tag, -1);
    }
    void exchange(std::span<std::span<std::byte const> const> pieces, std::uint64_t agreed, tag_t tag, rank_t from)
        requires detail::gives_direct_groups<Parent>
    {
        if (!direct_) throw invalid_argument("rank " + std::to_string(rank_) + ": this group has no direct exchanges (direct_bytes 0)");
        direct_->exchange(pieces, agreed, to_parent_tag(tag), from);
    }
    bool await_round()
        requires detail::gives_direct_groups<Parent>
    {
        return direct_ && direct_->await_round();
    }
    std::span<std::byte const> block(rank_t r) const noexcept
        requires detail::gives_direct_groups<Parent>
    {
        return direct_ ? direct_->block(r) : std::span<std::byte const>();
    }
    std::uint64_t agreed(rank_t r) const noexcept
        requires detail::gives_direct_groups<Parent>
    {
        return direct_ ? direct_->agreed(r) : 0;
    }

    /// Opens the direct exchanges, once (a collective of this group; split and group call it,
    /// through detail::open_direct_agreed). Its allgathers take a fixed schedule: CHORUS_ALGO
    /// names the user's collectives, and the group is not direct yet.
    void open_direct()
        requires detail::gives_direct_groups<Parent>
    {
        if (direct_) return;
        direct_ = parent_->open_direct_group(number_, members_, [this](std::span<std::byte const> own) {
            std::vector<std::byte> all(own.size() * members_.size());
            chorus::allgather<ring>(*this, own, all);
            return all;
        });
    }

    request isend(rank_t peer, tag_t tag, std::span<std::byte const> bytes) {
        return parent_->isend(to_parent(peer), to_parent_tag(tag), bytes);
    }
    request irecv(rank_t peer, tag_t tag, std::span<std::byte> bytes) {
        return parent_->irecv(to_parent(peer), to_parent_tag(tag), bytes);
    }
    std::uint64_t next_sequence() noexcept { return sequence_++; }
    /// Fails the parent's whole group: the group has no connections of its own.
    void abort(char const* reason) noexcept { parent_->abort(reason); }

private:
    rank_t to_parent(rank_t peer) const {
        if (peer < 0 || peer >= size()) throw invalid_argument(detail::peer_range_message(rank_, peer, size()));
        return parent_rank(peer);
    }
    tag_t to_parent_tag(tag_t tag) const {
        tag_t const group = tag_t{number_} << detail::group_shift;
        if (detail::is_collective_tag(tag))
            return collective_tag_bit | (tag_t{static_cast<std::uint8_t>(detail::tag_kind(tag))} << 56) | group |
                   (detail::tag_sequence(tag) & detail::group_sequence_mask);
        if (tag > max_user_tag)
            throw invalid_argument("rank " + std::to_string(rank_) + ": tag " + std::to_string(tag) +
                                   " is too large for a sub-group (its user tags are below 2^36)");
        return collective_tag_bit | group | tag;  // kind 0: no collective
    }

    Parent* parent_;
    std::vector<rank_t> members_;
    rank_t rank_;
    std::uint64_t number_;
    std::uint64_t sequence_ = 0;
    // Shared by copies of the group (the parent's slots are closed with the last).
    std::shared_ptr<typename detail::direct_group_of<Parent>::type> direct_;
};

namespace detail {

template <class T>
struct root_of {
    using type = T;
};
template <class P>
struct root_of<group_transport<P>> {
    using type = P;
};
/// The transport whose connections a group uses: a group of a group is a group of the root.
template <class T>
using root_t = typename root_of<T>::type;

template <class T>
T& root_transport(T& tp) noexcept {
    return tp;
}
template <class P>
P& root_transport(group_transport<P>& g) noexcept {
    return g.parent();
}
template <class T>
rank_t root_rank(T const&, rank_t r) noexcept {
    return r;
}
template <class P>
rank_t root_rank(group_transport<P> const& g, rank_t r) noexcept {
    return g.parent_rank(r);
}

/// The highest group number this process handed out (every transport's groups together).
inline std::atomic<std::uint64_t>& last_group_number() noexcept {
    static std::atomic<std::uint64_t> n{0};
    return n;
}

/// What each rank says in a split: its color and key, its process's last group number, and
/// a digest of the member list it asked for (group(): all ranks must ask for the same).
struct split_entry {
    std::int64_t color, key, last_number, digest;
};

// The parent's ranks' entries, in rank order: an allgather over the control channel of a
// transport that has one (a staged transport: its own buffers may be device memory), else over
// the parent itself, whose buffers must then be host memory.
template <transport Transport>
std::vector<split_entry> exchange_entries(Transport& tp, split_entry mine) {
    std::array<std::int64_t, 4> const own{mine.color, mine.key, mine.last_number, mine.digest};
    std::vector<std::int64_t> all(4 * static_cast<std::size_t>(tp.size()));
    if constexpr (requires { tp.control(); }) {
        chorus::allgather(tp.control(), own, all);
    } else {
        static_assert(host_transport<Transport>,
                      "chorus::split / chorus::group: a device transport needs a control() channel in host memory "
                      "for the exchange (a group of a device transport's group is not supported)");
        chorus::allgather(tp, own, all);
    }
    std::vector<split_entry> out;
    for (std::size_t i = 0; i < all.size(); i += 4) out.push_back({all[i], all[i + 1], all[i + 2], all[i + 3]});
    return out;
}

/// The number of a group made by a split whose ranks said `entries`; recorded as this
/// process's last.
template <transport Transport>
std::uint64_t agree_group_number(Transport& tp, std::vector<split_entry> const& entries) {
    std::int64_t highest = 0;
    for (auto const& e : entries) highest = std::max(highest, e.last_number);
    auto const number = static_cast<std::uint64_t>(highest) + 1;
    if (number > max_user_group_id) {
        std::string const what = "rank " + std::to_string(tp.rank()) + ": split: more than " +
                                 std::to_string(max_user_group_id) + " groups in one job";
        tp.abort(what.c_str());
        throw invalid_argument(what);
    }
    auto& last = last_group_number();
    for (std::uint64_t seen = last.load(); seen < number && !last.compare_exchange_weak(seen, number);) {
    }
    return number;
}

/// Opens `g`'s direct exchanges (null: this rank is in no group), then agrees over `tp`, every
/// rank of the split, whether every group could: where a group's ranks could not make their
/// slots each of them throws alike (shm_engine::open_area), and so must the ranks of the other
/// groups and those in none, a split being a collective of `tp`. One allgather of 256 bytes
/// per rank; the parent stays usable. Any other failure is the group's (it fails the parent).
template <transport Transport, class Group>
void open_direct_agreed(Transport& tp, Group* g) {
    std::array<char, 256> why{};
    try {
        if (g) g->open_direct();
    } catch (std::exception const& e) {
        if (dynamic_cast<agreed_failure const*>(&e) == nullptr) throw;
        std::string const what = e.what();
        std::memcpy(why.data(), what.data(), std::min(what.size(), why.size() - 1));
    }
    std::vector<char> all(why.size() * static_cast<std::size_t>(tp.size()));
    chorus::allgather<ring>(tp, std::span<char const>(why), all);
    for (std::size_t r = 0; r < all.size(); r += why.size())
        if (all[r] != 0)
            throw agreed<transport_error>(errc::connection_failed, -1, std::string(&all[r], strnlen(&all[r], why.size())));
}

/// The group of `members` (ranks of `tp`; none where this rank is not one of them), with its
/// direct exchanges where the parent gives them (agreed over `tp`: every rank calls it).
template <transport Transport>
std::optional<group_transport<root_t<Transport>>> make_group(Transport& tp, std::vector<rank_t> const& members,
                                                             std::uint64_t number) {
    std::optional<group_transport<root_t<Transport>>> g;
    if (auto const mine = std::ranges::find(members, tp.rank()); mine != members.end()) {
        std::vector<rank_t> roots;
        roots.reserve(members.size());
        for (rank_t m : members) roots.push_back(root_rank(tp, m));
        g.emplace(root_transport(tp), std::move(roots), static_cast<rank_t>(mine - members.begin()), number);
    }
    if constexpr (gives_direct_groups<root_t<Transport>>) open_direct_agreed(tp, g ? &*g : nullptr);
    return g;
}

// FNV-1a over the list: equal lists, equal digests.
template <class R>
std::int64_t digest_of(R const& ranks) noexcept {
    constexpr std::uint64_t prime = 1099511628211u;
    std::uint64_t h = 14695981039346656037u;
    for (auto r : ranks) {
        auto const x = static_cast<std::int64_t>(r);
        h = (h ^ static_cast<std::uint64_t>(x)) * prime;
    }
    return static_cast<std::int64_t>(h >> 1);
}

} // namespace detail

/// MPI_Comm_split: the ranks that pass the same `color` form a group, ordered by `key`, then
/// by their rank in `tp`. A rank passing `undefined_color` joins none and gets std::nullopt.
/// Collective over `tp` (every rank calls it, in its order of collectives).
/// @throws chorus::invalid_argument for a color below -1 (the group fails on every rank).
template <transport Transport>
std::optional<group_transport<detail::root_t<Transport>>> split(Transport& tp, int color, int key) {
    if (color < undefined_color)
        detail::fail_argument(tp, "split: color " + std::to_string(color) +
                                      " is negative (chorus::undefined_color, -1, joins no group)");
    auto const entries = detail::exchange_entries(
        tp, {color, key, static_cast<std::int64_t>(detail::last_group_number().load()), 0});
    std::uint64_t const number = detail::agree_group_number(tp, entries);
    std::vector<rank_t> members;  // none for undefined_color: no group, but the agreement over tp
    for (rank_t r = 0; r < tp.size() && color != undefined_color; ++r)
        if (entries[static_cast<std::size_t>(r)].color == color) members.push_back(r);
    std::ranges::stable_sort(members, {}, [&](rank_t r) { return entries[static_cast<std::size_t>(r)].key; });
    return detail::make_group(tp, members, number);
}

/// split with the rank in `tp` as the key: members keep the parent's order.
template <transport Transport>
std::optional<group_transport<detail::root_t<Transport>>> split(Transport& tp, int color) {
    return split(tp, color, tp.rank());
}

/// torch.distributed.new_group / MPI_Group_incl: the ranks of `tp` listed in `ranks` form a
/// group, group rank i being `ranks[i]`. Every rank of `tp` calls it with the same list;
/// ranks outside the list get std::nullopt.
/// @throws chorus::invalid_argument for a rank out of range or listed twice (the group fails
/// on every rank), or when the ranks passed different lists (thrown on every rank; the parent
/// stays usable).
template <transport Transport, count_range Ranks>
std::optional<group_transport<detail::root_t<Transport>>> group(Transport& tp, Ranks const& ranks) {
    std::vector<rank_t> members;
    for (auto r : ranks) {
        if (r < 0 || r >= tp.size())
            detail::fail_argument(tp, "group: rank " + std::to_string(r) + " is out of range for a group of " +
                                          std::to_string(tp.size()) + " ranks");
        if (std::ranges::find(members, static_cast<rank_t>(r)) != members.end())
            detail::fail_argument(tp, "group: rank " + std::to_string(r) + " is listed twice");
        members.push_back(static_cast<rank_t>(r));
    }
    auto const entries = detail::exchange_entries(
        tp, {0, 0, static_cast<std::int64_t>(detail::last_group_number().load()), detail::digest_of(members)});
    for (rank_t r = 0; r < tp.size(); ++r)
        if (entries[static_cast<std::size_t>(r)].digest != entries[0].digest)
            throw invalid_argument("rank " + std::to_string(tp.rank()) + ": group: rank " + std::to_string(r) +
                                   " passed another list of ranks than rank 0");
    return detail::make_group(tp, members, detail::agree_group_number(tp, entries));
}

} // namespace chorus
