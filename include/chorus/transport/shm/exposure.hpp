// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Buffers the ranks of one host read where they lie (shm_transport as an exposing_transport
// and a registering_transport, transport/concepts.hpp).
//
// Why: a rank cannot map another process's ordinary memory. Its large messages reach a peer
// as one copy made by the kernel (process_vm_readv), at 5-6 GB/s on the test VM, where a copy
// between two mappings of shared memory moves 10 (a 2-rank allgather of 32 MiB blocks: 4.3
// against 3.4 ms, docs/algorithms.md). So memory that peers are to read where it lies must be
// shared memory from the start, as MPI_Win_allocate_shared's and PyTorch's symmetric memory
// are: a shm_buffer, an anonymous memory file (memfd) mapped by its process.
//
// Registration (chorus::register_buffer, collective) maps each peer's allocation once: every
// rank publishes the descriptor number, device and inode of the memory file that
// holds its buffer; each peer opens it through /proc/<pid>/fd (as the transport's segments
// are opened), checks that it is that file, maps it whole with its page tables filled
// (MAP_POPULATE: a fault per 4 KiB page would cost more than the copy), and a second round
// tells every rank whether every rank mapped every peer's. Nothing is kept unless all did,
// so every rank gets the same answer. Later collectives on any range inside a registered
// buffer expose it in one round of records (registration number, offset, size): the zero_copy
// collectives and two_shot then read the peers' blocks with plain loads, no kernel call.
// The mappings are writable too (putting_transport), for one reason: a broadcast's root would
// otherwise idle while every other rank copies the whole vector; it writes a share of it into
// each peer's buffer meanwhile (at 2 ranks, 16 MiB: 0.50 against 0.97-1.08 ms for one rank
// copying it all, docs/algorithms.md). The transport's own segments are mapped writable by
// every peer already; a registration widens that to each rank's whole shm_buffer allocation
// (not only the registered range), which a stray write of a peer could now corrupt.
//
// A buffer outside every registration (memory that is not a shm_buffer's, or is but was
// not registered) is not exposed: its round says so and the collective falls back to the
// messages on every rank alike. The automatic choices try the exposed schedules only while
// some buffer is registered (exposes(): registrations are collective, so every rank knows the
// same), so a program that registers nothing pays no round for them.
//
// Lifetime: a peer's mapping keeps the memory file alive, so a rank that frees a registered
// buffer early does not fault its peers; they read stale bytes, which is why the contract
// forbids it. deregister_buffer unmaps the peers' allocations on every rank; destroying the
// transport unmaps what is left. Nothing has a name: nothing is left in /dev/shm.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chorus/error.hpp>
#include <chorus/fwd.hpp>
#include <chorus/transport/concepts.hpp>
#include <chorus/transport/shm/segment.hpp>

namespace chorus {

namespace detail {

/// A live shm_buffer's memory file, found by address (register_buffer looks its buffer up).
struct shm_allocation {
    std::byte* base = nullptr;
    std::size_t bytes = 0;  // mapped (whole pages)
    int fd = -1;
    std::uint64_t device = 0, inode = 0;
};

/// The process's live shm_buffers by base address: one table for every transport and thread.
class shm_allocations {
public:
    static shm_allocations& instance() {
        static shm_allocations table;
        return table;
    }
    void add(shm_allocation const& a) {
        std::lock_guard lock(mutex_);
        by_base_[reinterpret_cast<std::uintptr_t>(a.base)] = a;
    }
    void remove(std::byte const* base) {
        std::lock_guard lock(mutex_);
        by_base_.erase(reinterpret_cast<std::uintptr_t>(base));
    }
    /// The allocation that holds all of `range` (not empty), if any.
    std::optional<shm_allocation> holding(std::span<std::byte const> range) const {
        std::lock_guard lock(mutex_);
        auto const begin = reinterpret_cast<std::uintptr_t>(range.data());
        auto it = by_base_.upper_bound(begin);
        if (it == by_base_.begin()) return std::nullopt;
        --it;
        if (begin + range.size() > it->first + it->second.bytes) return std::nullopt;
        return it->second;
    }

private:
    mutable std::mutex mutex_;
    std::map<std::uintptr_t, shm_allocation> by_base_;
};

} // namespace detail

/// Memory that the ranks of a shm_transport group can read where it lies, once registered
/// (chorus::register_buffer): an anonymous memory file mapped by this process, zero-filled,
/// page-aligned. Collectives on ranges inside a registered shm_buffer read the peers' blocks
/// with plain loads, one copy, instead of through the kernel (transport/shm/exposure.hpp).
/// Move-only; unmapped on destruction (after deregister_buffer, on every rank that registered it).
///
///   chorus::shm_buffer memory(n * sizeof(float));
///   std::span<float> v = memory.as<float>();
///   auto reg = chorus::register_buffer(tp, v);   // collective
///   chorus::allgather(tp, v.first(n / p), ...);   // every rank's block read where it lies
///   chorus::deregister_buffer(tp, reg);           // collective
class shm_buffer {
public:
    shm_buffer() noexcept = default;
    /// `bytes` of shared memory (none for 0). Throws std::system_error where the system refuses.
    explicit shm_buffer(std::size_t bytes) : size_(bytes) {
        if (bytes == 0) return;
        auto const page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        std::size_t const mapped = (bytes + page - 1) / page * page;
        detail::shm::unique_fd fd(static_cast<int>(::syscall(SYS_memfd_create, "chorus-buffer", MFD_CLOEXEC)));
        if (fd.get() < 0) fail(errno, "memfd_create");
        if (::ftruncate(fd.get(), static_cast<off_t>(mapped)) != 0) fail(errno, "sizing the memory file", mapped);
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) fail(errno, "fstat");
        void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (p == MAP_FAILED) fail(errno, "mapping", mapped);
        allocation_ = {static_cast<std::byte*>(p), mapped, fd.get(), static_cast<std::uint64_t>(st.st_dev),
                       static_cast<std::uint64_t>(st.st_ino)};
        fd_ = std::move(fd);
        try {
            detail::shm_allocations::instance().add(allocation_);
        } catch (...) {  // the destructor of a constructor that throws is not run
            ::munmap(p, mapped);
            throw;
        }
    }
    shm_buffer(shm_buffer&& o) noexcept
        : size_(std::exchange(o.size_, 0)), allocation_(std::exchange(o.allocation_, {})), fd_(std::move(o.fd_)) {}
    shm_buffer& operator=(shm_buffer&& o) noexcept {
        if (this != &o) {
            reset();
            size_ = std::exchange(o.size_, 0);
            allocation_ = std::exchange(o.allocation_, {});
            fd_ = std::move(o.fd_);
        }
        return *this;
    }
    ~shm_buffer() { reset(); }

    std::size_t size() const noexcept { return size_; }
    std::byte* data() const noexcept { return allocation_.base; }
    std::span<std::byte> bytes() const noexcept { return {allocation_.base, size_}; }
    /// The memory as elements of T (as many as fit).
    template <class T>
    std::span<T> as() const noexcept {
        static_assert(std::is_trivially_copyable_v<T>, "shm_buffer holds trivially copyable elements");
        return {reinterpret_cast<T*>(allocation_.base), size_ / sizeof(T)};
    }

private:
    [[noreturn]] static void fail(int error, char const* what, std::size_t bytes = 0) {  // errno taken first
        throw std::system_error(error, std::system_category(),
                                std::string("chorus::shm_buffer: ") + what + (bytes ? " " + std::to_string(bytes) + " bytes" : ""));
    }
    void reset() noexcept {
        if (allocation_.base == nullptr) return;
        detail::shm_allocations::instance().remove(allocation_.base);
        ::munmap(allocation_.base, allocation_.bytes);
        allocation_ = {};
        fd_.reset();
        size_ = 0;
    }

    std::size_t size_ = 0;
    detail::shm_allocation allocation_;
    detail::shm::unique_fd fd_;
};

namespace detail {

/// A rank's registrations and the views of its latest exposed round (shm_transport's
/// exposing_transport and registering_transport members). `Engine`: shm_engine (exchange,
/// block, agreed, rank, size, direct_bytes, pid_of).
class shm_exposures {
public:
    /// Whether some buffer is registered (the same on every rank): only then do the automatic
    /// choices try an exposed round (select.hpp, exposes_now).
    bool exposes() const noexcept {
        return std::ranges::any_of(own_, [](own_registration const& k) { return k.read; });
    }
    /// Rounds so far in which every rank's buffer was read where it lies.
    std::uint64_t exposed_rounds() const noexcept { return exposed_; }
    /// Whether the latest round was an exposure that succeeded: block(r) then shows rank r's
    /// buffer (or its part for this rank) where it lies.
    bool active() const noexcept { return active_; }
    std::span<std::byte const> block(rank_t r) const noexcept { return views_[static_cast<std::size_t>(r)]; }
    /// block(r) of a peer, writable (putting_transport): the peers' allocations are mapped so.
    std::span<std::byte> put_block(rank_t r) const noexcept { return puts_[static_cast<std::size_t>(r)]; }
    /// Whether `buffer` lies in one of this rank's registrations (putting_transport).
    bool exposable(std::span<std::byte const> buffer) const { return registration_holding(buffer) != nullptr; }
    /// Called before every other round: the views end with the round.
    void end_round() noexcept { active_ = false; }

    /// A round whose block is `buffer` itself (each peer r reading `parts[r]` of it where
    /// `parts` is not empty): true on every rank where every rank's buffer lies in one of its
    /// registrations (or is empty), false on every rank otherwise.
    template <class Engine>
    bool expose(Engine& e, std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts,
                std::uint64_t agreed, tag_t tag) {
        end_round();
        auto const p = static_cast<std::size_t>(e.size()), me = static_cast<std::size_t>(e.rank());
        if (!parts.empty()) check_parts(e, buffer, parts);
        std::size_t const bytes = sizeof(record) + parts.size() * sizeof(extent);
        if (bytes > e.direct_bytes()) {  // too many ranks for the slot: the same on every rank
            e.exchange_in_place({}, agreed, tag);
            return fall_back(p);
        }
        record mine{};
        mine.bytes = buffer.size();
        // A buffer no peer reads (empty; a group of one; every peer's part empty) needs no
        // registration and cannot make the round fall back (docs/concepts.md#exposing_transport).
        bool unread = buffer.empty() || p == 1;
        if (!parts.empty() && !unread) {
            unread = true;
            for (std::size_t r = 0; r < p; ++r)
                if (r != me && !parts[r].empty()) unread = false;
        }
        if (unread) {
            mine.registration = unread_buffer;
        } else if (own_registration const* k = registration_holding(buffer)) {
            mine.registration = k->id;
            mine.offset = static_cast<std::uint64_t>(buffer.data() - k->allocation);
        }
        scratch_.resize(bytes);
        std::memcpy(scratch_.data(), &mine, sizeof mine);
        for (std::size_t r = 0; r < parts.size(); ++r) {
            extent const x{parts[r].empty() ? 0 : static_cast<std::uint64_t>(parts[r].data() - buffer.data()) + mine.offset,
                           parts[r].size()};
            std::memcpy(scratch_.data() + sizeof(record) + r * sizeof(extent), &x, sizeof x);
        }
        std::span<std::byte const> const piece(scratch_);
        e.exchange_in_place(std::span<std::span<std::byte const> const>(&piece, 1), agreed, tag);
        if (!same_words(e)) return fall_back(p);  // the caller's shape check names the rank
        // First whether every rank's buffer can be read (every rank decides alike, from the
        // same records), then where.
        for (std::size_t r = 0; r < p; ++r)
            if (e.block(static_cast<rank_t>(r)).size() != bytes || record_of(e, r).registration == 0) return fall_back(p);
        views_.assign(p, {});
        puts_.assign(p, {});
        for (std::size_t r = 0; r < p; ++r) {
            record const theirs = record_of(e, r);
            if (r == me) {
                views_[r] = parts.empty() ? buffer : parts[me];
                continue;
            }
            extent x{theirs.offset, theirs.bytes};
            if (!parts.empty()) std::memcpy(&x, e.block(static_cast<rank_t>(r)).data() + sizeof(record) + me * sizeof(extent), sizeof x);
            if (x.bytes == 0) continue;
            peer_registration const* k = theirs.registration == unread_buffer ? nullptr : peer_holding(theirs.registration, r);
            if (k == nullptr || x.offset > k->bytes || x.bytes > k->bytes - x.offset) {
                // Registrations are collective and records are this code's: a broken invariant.
                std::string const what = "shm_transport: rank " + std::to_string(r) + " exposed " + std::to_string(x.bytes) +
                                         " bytes at " + std::to_string(x.offset) + " of registration " +
                                         std::to_string(theirs.registration) + ", which rank " + std::to_string(me) +
                                         " does not hold so";
                e.abort(e.rank(), what);
                throw invalid_argument(what);
            }
            puts_[r] = {k->memory->base() + x.offset, static_cast<std::size_t>(x.bytes)};
            views_[r] = puts_[r];
        }
        active_ = true;
        ++exposed_;
        return true;
    }

    /// Registers `buffer` (two rounds): its number, the same on every rank, or 0 on every rank
    /// where some rank's buffer is not a shm_buffer's or some peer could not map it.
    template <class Engine>
    std::uint64_t keep(Engine& e, std::span<std::byte const> buffer, std::uint64_t agreed, tag_t tag) {
        end_round();
        std::uint64_t const id = ++count_;  // every rank counts every call alike
        if (sizeof(record) > e.direct_bytes()) {
            e.exchange({}, agreed, tag);
            return 0;
        }
        record mine{};
        mine.bytes = buffer.size();
        std::optional<shm_allocation> a;
        if (buffer.empty()) {
            mine.registration = unread_buffer;
        } else if ((a = shm_allocations::instance().holding(buffer))) {
            mine.registration = id;
            mine.offset = static_cast<std::uint64_t>(buffer.data() - a->base);
            mine.allocation_bytes = a->bytes;
            mine.fd = a->fd;
            mine.device = a->device;
            mine.inode = a->inode;
        }
        std::span<std::byte const> piece(reinterpret_cast<std::byte const*>(&mine), sizeof mine);
        e.exchange(std::span<std::span<std::byte const> const>(&piece, 1), agreed, tag);
        if (!same_words(e)) return 0;
        auto const p = static_cast<std::size_t>(e.size()), me = static_cast<std::size_t>(e.rank());
        for (std::size_t r = 0; r < p; ++r)
            if (record_of(e, r).registration == 0) return 0;  // some rank's buffer is not shared memory
        bool read = false;  // some rank registered bytes to read: only then do the choices try exposing
        for (std::size_t r = 0; r < p; ++r) read = read || record_of(e, r).registration != unread_buffer;
        std::vector<peer_registration> opened;
        bool mapped = true;
        for (std::size_t r = 0; r < p && mapped; ++r) {
            record const theirs = record_of(e, r);
            if (r == me || theirs.registration == unread_buffer) continue;
            auto const owner = static_cast<rank_t>(r);
            if (auto m = map_peer(owner, e.pid_of(owner), theirs))
                opened.push_back({id, owner, std::move(m), theirs.allocation_bytes, theirs.inode, theirs.device});
            else mapped = false;
        }
        std::byte const ok = mapped ? std::byte{1} : std::byte{0};
        piece = std::span<std::byte const>(&ok, 1);
        e.exchange(std::span<std::span<std::byte const> const>(&piece, 1), agreed, tag);
        if (!same_words(e)) return 0;
        for (std::size_t r = 0; r < p; ++r)
            if (e.block(static_cast<rank_t>(r)).empty() || e.block(static_cast<rank_t>(r))[0] != std::byte{1}) return 0;
        for (auto& o : opened) peers_.push_back(std::move(o));
        own_.push_back({id, buffer.data(), buffer.data() + buffer.size(), a ? a->base : nullptr, a ? a->inode : 0, read});
        return id;
    }

    /// Ends registration `id` (0: none): unmaps the peers' allocations kept for it, then a round
    /// in which every rank did (each may free its buffer once it returned).
    template <class Engine>
    void release(Engine& e, std::uint64_t id, std::uint64_t agreed, tag_t tag) {
        end_round();
        std::erase_if(own_, [&](own_registration const& k) { return k.id == id; });
        std::erase_if(peers_, [&](peer_registration const& k) { return k.id == id; });  // reads are done: they were loads
        e.exchange({}, agreed, tag);
    }

private:
    // What a rank publishes in an exposure or registration round.
    struct record {
        std::uint64_t registration;  // 0: not shared memory (not exposed); unread_buffer: nothing for the peers to read
        std::uint64_t offset;        // of the buffer in its allocation
        std::uint64_t bytes;         // the buffer's
        std::uint64_t allocation_bytes, device, inode;  // a registration's memory file
        std::int64_t fd;             // ... its descriptor in the owner's process
    };
    struct extent {  // a peer's part in an exposure in parts, from the allocation's start
        std::uint64_t offset, bytes;
    };
    static constexpr std::uint64_t unread_buffer = ~std::uint64_t{0};  // in a record: nothing for the peers to read

    struct own_registration {
        std::uint64_t id;
        std::byte const* begin;
        std::byte const* end;
        std::byte const* allocation;  // its memory file's mapping here
        std::uint64_t inode;          // ... and that file (a freed buffer's address may hold another)
        bool read;                    // some rank's registered buffer is not empty
    };
    struct peer_registration {
        std::uint64_t id;
        rank_t owner;
        std::shared_ptr<shm::mapping const> memory;  // the owner's whole allocation
        std::uint64_t bytes;  // mapped
        std::uint64_t inode, device;  // registrations of one allocation share its mapping
    };

    // A round that falls back: every rank's block of it is empty (exposing_transport).
    bool fall_back(std::size_t p) {
        views_.assign(p, {});
        puts_.assign(p, {});
        active_ = true;
        return false;
    }

    // Parts that do not fit the call fail the group, not only this rank (its peers would
    // wait for its round until the timeout).
    template <class Engine>
    static void check_parts(Engine& e, std::span<std::byte const> buffer, std::span<std::span<std::byte const> const> parts) {
        std::string const what = exposed_parts_error("shm_transport", static_cast<std::size_t>(e.size()), buffer, parts);
        if (what.empty()) return;
        e.abort(e.rank(), what);
        throw invalid_argument(what);
    }

    template <class Engine>
    static bool same_words(Engine const& e) noexcept {
        for (rank_t r = 1; r < e.size(); ++r)
            if (e.agreed(r) != e.agreed(0)) return false;
        return true;
    }

    template <class Engine>
    static record record_of(Engine const& e, std::size_t r) noexcept {
        record x{};  // a rank that published less (a different collective) reads as not exposed
        auto const b = e.block(static_cast<rank_t>(r));
        if (b.size() >= sizeof x) std::memcpy(&x, b.data(), sizeof x);
        return x;
    }

    // The registration whose buffer holds `buffer`, if that memory is still the file registered
    // (a buffer freed before deregister_buffer, its address reused by a new shm_buffer, is not).
    own_registration const* registration_holding(std::span<std::byte const> buffer) const {
        for (auto const& k : own_) {
            if (std::less<>{}(buffer.data(), k.begin) || std::less<>{}(k.end, buffer.data() + buffer.size())) continue;
            auto const a = shm_allocations::instance().holding(buffer);
            if (a && a->base == k.allocation && a->inode == k.inode) return &k;
        }
        return nullptr;
    }

    peer_registration const* peer_holding(std::uint64_t id, std::size_t r) const noexcept {
        for (auto const& k : peers_)
            if (k.id == id && static_cast<std::size_t>(k.owner) == r) return &k;
        return nullptr;
    }

    // The peer's memory file, opened through /proc and checked to be the one it named (its
    // descriptor number could name another file by the time this rank looks), mapped whole.
    // A registration of an allocation this rank maps already (another range of the same
    // shm_buffer) shares that mapping.
    // (While this rank maps a file, no new file can take its inode.)
    std::shared_ptr<shm::mapping const> map_peer(rank_t owner, long pid, record const& theirs) const {
        for (auto const& k : peers_)
            if (k.owner == owner && k.inode == theirs.inode && k.device == theirs.device && k.bytes == theirs.allocation_bytes)
                return k.memory;
        shm::unique_fd fd(shm::open_peer_segment(pid, static_cast<int>(theirs.fd), O_RDWR));
        if (fd.get() < 0) return nullptr;
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0 || static_cast<std::uint64_t>(st.st_dev) != theirs.device ||
            static_cast<std::uint64_t>(st.st_ino) != theirs.inode ||
            static_cast<std::uint64_t>(st.st_size) < theirs.allocation_bytes)
            return nullptr;
        auto m = shm::mapping::populated(fd.get(), static_cast<std::size_t>(theirs.allocation_bytes));
        if (!m) return nullptr;
        return std::make_shared<shm::mapping const>(std::move(*m));
    }

    std::vector<own_registration> own_;
    std::vector<peer_registration> peers_;
    std::vector<std::span<std::byte const>> views_;
    std::vector<std::span<std::byte>> puts_;  // views_ of the peers, writable
    std::vector<std::byte> scratch_;
    std::uint64_t count_ = 0;
    std::uint64_t exposed_ = 0;
    bool active_ = false;
};

} // namespace detail
} // namespace chorus
