// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The memory shm_transport's ranks share, and the system calls around it (Linux).
//
// Each rank owns one segment: an anonymous memory file (memfd_create) that its peers open
// through /proc/<pid>/fd/<fd> during set-up, after which the owner closes the descriptor. The
// file never has a name in /dev/shm, so a crash at any moment leaves nothing behind (a named
// POSIX segment unlinked right after mapping still leaks if a rank dies between creating and
// unlinking it); the memory goes when the last process that maps it exits.
//
// Layout of rank r's segment: its header (one page), its two direct slots (the blocks of its
// direct exchanges, alternate rounds; see direct_slot), then one ring per sender s (s = r
// included): a ring_header (the sender's head and the receiver's tail, a cache line each, so
// that the two sides never write one line) and the ring's bytes. Everything a peer writes into
// r's segment is a ring it is the only writer of, or an atomic of r's header.
//
// Records in a ring: a 40-byte record_header, the payload right behind it, the whole rounded up
// to 64 bytes (an 8-byte message is one cache line). A record never wraps: one that would is
// preceded by a `wrap` record filling the ring to its end.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chorus/error.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail::shm {

inline constexpr std::size_t line = 64;
inline constexpr std::size_t reason_bytes = 1024;

constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

/// A rank's header, at the start of its segment. Peers write its atomics: the doorbell (a
/// futex word, bumped to wake the rank), the failure (first writer wins) and nothing else.
struct rank_header {
    alignas(line) std::atomic<std::uint32_t> doorbell{0};
    std::atomic<std::uint32_t> sleeping{0};  // the owner is in (or about to enter) futex_wait
    alignas(line) std::atomic<std::int32_t> failed_by{-1};  // the rank the group's failure is blamed on
    std::atomic<std::uint32_t> reason_ready{0};            // reason holds the failure's text
    std::atomic<std::uint32_t> left{0};                    // the owner destroyed its transport
    char reason[reason_bytes]{};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to be shared between processes");

/// One sender's ring in a receiver's segment: the sender moves head, the receiver tail
/// (bytes since the start, never wrapped).
struct ring_header {
    alignas(line) std::atomic<std::uint64_t> head{0};
    alignas(line) std::atomic<std::uint64_t> tail{0};
};

enum class record_kind : std::uint32_t {
    wrap = 1,     // the rest of the ring up to its end is unused
    message = 2,  // the first part of a message: tag, size, and the first `bytes` of payload
    more = 3,     // the next `bytes` of the message being received from this sender
    remote = 4,   // a message the receiver reads from the sender's memory: addr, id
    ack = 5,      // the receiver read the sender's `remote` message `id`: its send completed
};

struct record_header {
    std::uint64_t tag;
    std::uint64_t size;  // the whole message's bytes
    std::uint64_t addr;  // remote: the sender's buffer
    std::uint64_t id;    // remote, ack: the send's number
    record_kind kind;
    std::uint32_t bytes;  // payload in this record
};
inline constexpr std::size_t record_header_bytes = sizeof(record_header);
static_assert(record_header_bytes == 40);

/// The head of one of a rank's two direct slots: the block it published in a direct exchange
/// (shm_engine::exchange) follows at direct_block_offset. The owner writes the block, `agreed`
/// and `bytes`, then `round` (release); a peer reads them once `round` is the round it waits
/// for. Round r uses slot r % 2: the owner can reach round r + 2 only after every peer
/// published round r + 1, which a peer does only once it is done reading round r.
struct direct_slot {
    std::atomic<std::uint64_t> round{0};
    std::uint64_t agreed = 0;  // a word every rank of the round publishes alike (the collective's shape)
    std::uint64_t bytes = 0;   // of the block, with in_place_round where it is a record of a buffer read where it lies
    std::uint64_t tag = 0;     // of the collective: a peer that waits for a message of it was called otherwise
};
/// The flag in direct_slot::bytes of an exposure round (shm/exposure.hpp): a rank whose peer
/// publishes a copy in the same round of the same collective (ranks that run one_shot and
/// zero_copy of one call) must not read the one as the other.
inline constexpr std::uint64_t in_place_round = std::uint64_t{1} << 63;
/// Where a slot's block starts: 32 bytes into the slot's first cache line, so that a block of
/// up to 32 bytes travels in the line that announces it, aligned for any type up to 32 bytes.
inline constexpr std::size_t direct_block_offset = 32;
static_assert(sizeof(direct_slot) <= direct_block_offset);

/// Bytes a record of `payload` bytes occupies.
constexpr std::size_t record_bytes(std::size_t payload) noexcept { return round_up(record_header_bytes + payload, line); }

/// Where things are in a segment of `size` rings of `ring_bytes` each, with direct slots for
/// blocks of up to `direct_bytes`.
struct layout {
    std::size_t ring_bytes = 0;
    std::size_t size = 0;
    std::size_t direct_bytes = 0;

    static constexpr std::size_t header_bytes = round_up(sizeof(rank_header), 4096);
    std::size_t slot_stride() const noexcept { return round_up(direct_block_offset + direct_bytes, line); }
    std::size_t rings_at() const noexcept { return header_bytes + 2 * slot_stride(); }
    std::size_t stride() const noexcept { return sizeof(ring_header) + ring_bytes; }
    std::size_t total() const noexcept { return rings_at() + size * stride(); }
    static rank_header* header(std::byte* base) noexcept { return reinterpret_cast<rank_header*>(base); }
    direct_slot* slot(std::byte* base, std::uint64_t round) const noexcept {
        return reinterpret_cast<direct_slot*>(base + header_bytes + (round % 2) * slot_stride());
    }
    ring_header* ring(std::byte* base, std::size_t sender) const noexcept {
        return reinterpret_cast<ring_header*>(base + rings_at() + sender * stride());
    }
    std::byte* data(std::byte* base, std::size_t sender) const noexcept {
        return base + rings_at() + sender * stride() + sizeof(ring_header);
    }
};

[[noreturn]] inline void throw_system(std::string const& what) {
    throw transport_error(errc::connection_failed, -1,
                          "shm_transport: " + what + ": " + std::system_category().message(errno));
}

/// A mapping of a whole segment; unmapped on destruction.
class mapping {
public:
    mapping() = default;
    mapping(int fd, std::size_t bytes, std::string const& what) : bytes_(bytes) {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) throw_system("mapping " + what);
        base_ = static_cast<std::byte*>(p);
    }
    mapping(mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
    mapping& operator=(mapping&& o) noexcept {
        if (this != &o) {
            reset();
            base_ = std::exchange(o.base_, nullptr);
            bytes_ = o.bytes_;
        }
        return *this;
    }
    ~mapping() { reset(); }
    std::byte* base() const noexcept { return base_; }

    /// A mapping of another process's memory file with its page tables filled (MAP_POPULATE:
    /// no fault per page on the reads and writes that follow); none where mmap fails.
    static std::optional<mapping> populated(int fd, std::size_t bytes) noexcept {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) return std::nullopt;
        mapping m;
        m.base_ = static_cast<std::byte*>(p);
        m.bytes_ = bytes;
        return m;
    }

private:
    void reset() noexcept {
        if (base_) ::munmap(base_, bytes_);
        base_ = nullptr;
    }
    std::byte* base_ = nullptr;
    std::size_t bytes_ = 0;
};

/// A file descriptor, closed on destruction.
class unique_fd {
public:
    unique_fd() = default;
    explicit unique_fd(int fd) noexcept : fd_(fd) {}
    unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    unique_fd& operator=(unique_fd&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = std::exchange(o.fd_, -1);
        }
        return *this;
    }
    ~unique_fd() { reset(); }
    int get() const noexcept { return fd_; }
    void reset() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

/// A new anonymous memory file of `bytes`, zero-filled.
inline unique_fd create_segment(std::size_t bytes, std::string const& name) {
    unique_fd fd(static_cast<int>(::syscall(SYS_memfd_create, name.c_str(), MFD_CLOEXEC)));
    if (fd.get() < 0) throw_system("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) throw_system("sizing the segment to " + std::to_string(bytes) + " bytes");
    return fd;
}

/// Opens another process's segment by its descriptor; -1 with errno on failure.
inline int open_peer_segment(long pid, int fd, int mode = O_RDWR) noexcept {
    std::string const path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    return ::open(path.c_str(), mode | O_CLOEXEC);
}

/// A descriptor that becomes readable when process `pid` exits (pidfd_open, Linux 5.3); -1
/// where the kernel has none (then liveness falls back to kill(pid, 0)).
inline int open_pidfd(long pid) noexcept {
#if defined(SYS_pidfd_open)
    return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/// Whether the process behind `pidfd` (or `pid`, without one) has exited.
inline bool process_exited(int pidfd, long pid) noexcept {
    if (pidfd >= 0) {
        pollfd p{pidfd, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;
    }
    return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

/// Whether process `pid` is stopped (SIGSTOP, or a debugger holds it): state T or t in
/// /proc/PID/stat.
inline bool process_stopped(long pid) noexcept {
    std::string const path = "/proc/" + std::to_string(pid) + "/stat";
    int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[512];
    ssize_t const n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    char const* paren = std::strrchr(buf, ')');  // the command name may hold spaces and ')'
    return paren && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't');
}

/// Reads `bytes` at `remote` of process `pid` into `local` (cross-memory attach: one copy,
/// by the kernel). Returns 0, or the errno that stopped it.
inline int read_remote(long pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept {
    auto* to = static_cast<std::byte*>(local);
    while (bytes > 0) {
        iovec l{to, bytes};
        iovec r{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
        ssize_t const n = ::process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EFAULT;
        to += n;
        remote += static_cast<std::uint64_t>(n);
        bytes -= static_cast<std::size_t>(n);
    }
    return 0;
}

/// Under Yama's ptrace_scope 1 a process may read only its descendants' memory: allow every
/// process of this user (as Open MPI's shared-memory path does) so that ranks, which are
/// siblings, can read each other's buffers. Without Yama this changes nothing.
inline void allow_remote_reads() noexcept {
#if defined(PR_SET_PTRACER)
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds for_at_most) noexcept {
    timespec ts{static_cast<time_t>(for_at_most.count() / 1000000000), static_cast<long>(for_at_most.count() % 1000000000)};
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

/// Wakes the owner of `h` if it sleeps. The caller published what the owner waits for before
/// (the fence orders that before the read of `sleeping`; the sleeper fences between setting
/// `sleeping` and its last look, so one of the two sees the other).
inline void ring_doorbell(rank_header& h, bool always = false) noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (always || h.sleeping.load(std::memory_order_relaxed) != 0) {
        h.doorbell.fetch_add(1, std::memory_order_seq_cst);
        futex_wake_all(h.doorbell);
    }
}

/// The CPUs this thread may run on (its affinity mask); where that cannot be read, the first
/// hardware_concurrency() CPUs (at least one).
inline cpu_set_t own_cpus() noexcept {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) == 0) {
        CPU_ZERO(&set);
        std::size_t const n = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, CPU_SETSIZE);
        for (std::size_t c = 0; c < n; ++c) CPU_SET(c, &set);
    }
    return set;
}

/// This host's boot id: ranks that report the same one (and the same PID namespace) can share
/// memory.
inline std::string host_identity() {
    std::string id;
    if (int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC); fd >= 0) {
        char buf[64]{};
        ssize_t const n = ::read(fd, buf, sizeof buf - 1);
        ::close(fd);
        if (n > 0) id.assign(buf, static_cast<std::size_t>(n));
        while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    }
    struct stat st{};
    if (::stat("/proc/self/ns/pid", &st) == 0) id += "/pidns:" + std::to_string(st.st_ino);
    return id;
}

} // namespace chorus::detail::shm
