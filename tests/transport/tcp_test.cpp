// SPDX-License-Identifier: MIT
// tcp_transport: the transport conformance suite, every collective front door over real
// sockets (ranks as threads of this process, on 127.0.0.1 or ::1), the rendezvous's
// robustness against stray connections, its timeout naming a missing rank, and from_env.
// Also the staged transport protocol (CUDA IPC's, detail/staged_engine.hpp) over a host
// model of a device, whose control channel is a tcp_transport: conformance and collectives.

#include <doctest/doctest.h>

#include <chorus/chorus.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/staged.hpp>
#include <chorus/transport/tcp.hpp>
#include <chorus/transport/tcp/gate.hpp>
#include <chorus/transport/tcp/net.hpp>

#include "../support/registered_check.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../support/collective_matrix.hpp"
#include "../support/conformance.hpp"
#include "../support/host_model_device.hpp"

using chorus::rank_t;
using namespace std::chrono_literals;

static_assert(chorus::transport<chorus::tcp_transport>);
static_assert(chorus::host_transport<chorus::tcp_transport>);
static_assert(chorus::request<chorus::tcp_transport::request>);
static_assert(!std::is_copy_constructible_v<chorus::tcp_transport::request>);

namespace {

/// Runs fn(transport) on p ranks, threads of this process. Rank 0 binds master port 0 and
/// hands the port it got to the others through a promise: no fixed ports, safe in parallel.
/// `on_port` (optional) runs in rank 0's thread once the master listens, before any other
/// rank starts. A throwing rank aborts the group; the first exception is rethrown.
/// Factory::make(optional<Factory::transport>&, tcp_config) builds a rank's transport.
template <class Factory>
struct threaded_runner {
    template <class Fn>
    static void run(rank_t p, Fn&& fn, std::chrono::milliseconds timeout, std::string const& addr = "127.0.0.1",
                    std::function<void(std::uint16_t)> on_port = {}, rank_t started = -1,
                    std::function<void(chorus::tcp_config&)> configure = {}) {
        if (started < 0) started = p;
        std::promise<std::uint16_t> port_promise;
        std::shared_future<std::uint16_t> port = port_promise.get_future().share();
        bool port_set = false;  // rank 0's thread only
        std::mutex mutex;
        std::exception_ptr first;
        std::vector<std::thread> threads;
        for (rank_t r = 0; r < started; ++r) {
            threads.emplace_back([&, r] {
                std::optional<typename Factory::transport> tp;
                try {
                    chorus::tcp_config c;
                    c.rank = r;
                    c.size = p;
                    c.master_addr = addr;
                    c.timeout = timeout;
                    c.job_token = "chorus-test-token";
                    if (configure) configure(c);
                    if (r == 0) {
                        c.on_master_listening = [&](std::uint16_t bound) {
                            if (on_port) on_port(bound);
                            port_set = true;
                            port_promise.set_value(bound);
                        };
                    } else {
                        if (port.wait_for(timeout + 10s) != std::future_status::ready)
                            throw std::runtime_error("rank 0 never listened");
                        c.master_port = port.get();
                    }
                    Factory::make(tp, std::move(c));
                    fn(*tp);
                } catch (std::exception const& e) {
                    {
                        std::lock_guard lock(mutex);
                        if (!first) first = std::current_exception();
                    }
                    if (r == 0 && !port_set) port_promise.set_exception(std::current_exception());
                    if (tp) tp->abort(e.what());
                }
            });
        }
        for (auto& t : threads) t.join();
        if (first) std::rethrow_exception(first);
    }
};

struct tcp_factory {
    using transport = chorus::tcp_transport;
    static void make(std::optional<transport>& tp, chorus::tcp_config c) { tp.emplace(std::move(c)); }
};
using tcp_runner = threaded_runner<tcp_factory>;

/// The staged protocol over the host model, with FIFOs of 3 slots of 256 bytes: messages of
/// more than 768 bytes wait for credits, and most messages are several chunks; one_shot
/// rounds of up to 16 KiB. Its control channel is cuda_ipc_transport's: shared memory (rings
/// of 64 KiB, no slots of its own), the ranks meeting once over TCP.
using staged_model = chorus::staged_transport<testing_support::host_model_device, chorus::shm_transport>;
struct staged_factory {
    using transport = staged_model;
    static void make(std::optional<transport>& tp, chorus::tcp_config c) {
        chorus::shm_config memory;
        memory.timeout = c.timeout;
        memory.ring_bytes = 64 * 1024;
        memory.direct_bytes = 0;
        tp.emplace(chorus::shm_transport::over(chorus::tcp_transport(std::move(c)), memory), chorus::staged_config{256, 3, 16 * 1024},
                   testing_support::host_model_device{});
    }
};
using staged_runner = threaded_runner<staged_factory>;

/// Shared memory, joined over a TCP bootstrap: default rings with remote reads from 32 KiB
/// (process_vm_readv), and rings of one page with no remote reads (every message of more than
/// 984 bytes in parts, the ring wrapping all the time); one_shot rounds of at most DirectBytes.
template <std::size_t RingBytes, std::size_t RemoteBytes, std::size_t DirectBytes = 16 * 1024>
struct shm_factory {
    using transport = chorus::shm_transport;
    static void make(std::optional<transport>& tp, chorus::tcp_config c) {
        chorus::shm_config s;
        s.timeout = c.timeout;
        s.ring_bytes = RingBytes;
        s.remote_bytes = RemoteBytes;
        s.direct_bytes = DirectBytes;
        chorus::tcp_transport bootstrap(std::move(c));
        tp.emplace(bootstrap, s);
    }
};
using shm_runner = threaded_runner<shm_factory<256 * 1024, 32 * 1024>>;
using shm_ring_runner = threaded_runner<shm_factory<4096, 0>>;
/// one_shot rounds of 64 bytes: every collective of more than a few elements takes many; and
/// none at all (direct_bytes 0: the automatic choice never takes one_shot).
using shm_rounds_runner = threaded_runner<shm_factory<4096, 0, 64>>;
using shm_no_direct_runner = threaded_runner<shm_factory<4096, 0, 0>>;

/// The CPUs this thread may run on, in order.
std::vector<std::size_t> allowed_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    std::vector<std::size_t> cpus;
    for (std::size_t c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

/// shm_runner's transport, each rank's thread first bound to one CPU of the test's: rank r to
/// the r-th (modulo their count), or every rank to the first (SameCpu).
template <bool SameCpu>
struct bound_shm_factory {
    using transport = chorus::shm_transport;
    static void make(std::optional<transport>& tp, chorus::tcp_config c) {
        std::vector<std::size_t> const cpus = allowed_cpus();
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[SameCpu ? 0 : static_cast<std::size_t>(c.rank) % cpus.size()], &one);
        REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);  // this thread only
        shm_factory<256 * 1024, 32 * 1024>::make(tp, std::move(c));
    }
};
static_assert(chorus::transport<chorus::shm_transport>);
static_assert(chorus::host_transport<chorus::shm_transport>);
static_assert(chorus::direct_transport<chorus::shm_transport>);
static_assert(chorus::rooted_transport<chorus::shm_transport>);
static_assert(!chorus::direct_transport<chorus::tcp_transport>);
// A sub-group of shared memory exchanges directly in slots of its own (not its parent's buffers).
static_assert(chorus::rooted_transport<chorus::group_transport<chorus::shm_transport>>);
static_assert(!chorus::exposing_transport<chorus::group_transport<chorus::shm_transport>>);
static_assert(!chorus::direct_transport<chorus::group_transport<chorus::tcp_transport>>);
static_assert(chorus::direct_transport<staged_model>);
static_assert(chorus::transport<staged_model>);
static_assert(chorus::host_transport<staged_model>);

char const* const launcher_variables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
    "CHORUS_BLAME_FD", "CHORUS_JOB_TOKEN", "CHORUS_TIMEOUT_MS", "CHORUS_HEARTBEAT_MS", "CHORUS_SPIN_US", "CHORUS_SOCKET_IFNAME", "CHORUS_PORT_RANGE", "CHORUS_MAX_MESSAGE_BYTES",
    "CHORUS_MASTER_FD", "CHORUS_TCP_CONGESTION", "CHORUS_NT_COPY_BYTES"};

void unset_launcher_env() {
    for (char const* v : launcher_variables) ::unsetenv(v);
}

/// A listening IPv4 socket on 127.0.0.1 and its port, as chorusrun makes one.
std::pair<int, std::uint16_t> listening_socket() {
    int const fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return {fd, ntohs(a.sin_port)};
}

bool ipv6_loopback_available() {
    asio::io_context io;
    asio::ip::tcp::acceptor a(io);
    asio::error_code ec;
    a.open(asio::ip::tcp::v6(), ec);
    if (!ec) a.bind(asio::ip::tcp::endpoint(asio::ip::make_address("::1"), 0), ec);
    return !ec;
}

} // namespace

TEST_CASE_TEMPLATE_INVOKE(transport_conformance, tcp_runner, staged_runner, shm_runner, shm_ring_runner);

TEST_CASE("tcp: every collective front door at 2, 3 and 4 ranks") {
    for (rank_t p : {2, 3, 4}) {
        CAPTURE(p);
        std::mutex mutex;
        std::vector<std::string> failures;
        tcp_runner::run(p, [&](chorus::tcp_transport& tp) {
            rank_t const me = tp.rank();
            auto const P = static_cast<std::size_t>(p);
            auto const M = static_cast<std::size_t>(me);
            auto check = [&](bool ok, std::string const& what) {
                if (ok) return;
                std::lock_guard lock(mutex);
                failures.push_back("rank " + std::to_string(me) + ": " + what);
            };
            chorus::barrier(tp);
            for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70000}}) {
                std::string const at = " n=" + std::to_string(n);
                auto const N = static_cast<std::int64_t>(n);
                (void)N;
                // allreduce: sum over ranks of (rank + i) = p*i + p(p-1)/2
                auto const expected_sum = [&](std::size_t i) {
                    return static_cast<std::int64_t>(P * i + P * (P - 1) / 2);
                };
                {
                    std::vector<std::int64_t> v(n);
                    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int64_t>(M + i);
                    chorus::allreduce(tp, v);
                    bool ok = true;
                    for (std::size_t i = 0; i < n; ++i) ok = ok && v[i] == expected_sum(i);
                    check(ok, "allreduce" + at);
                }
                {
                    std::vector<float> v(n, 1.0f);
                    chorus::allreduce<chorus::ring>(tp, v);
                    bool ok = true;
                    for (float x : v) ok = ok && x == static_cast<float>(p);
                    check(ok, "allreduce<ring>" + at);
                    chorus::allreduce<chorus::tree>(tp, v, chorus::maximum{});
                    chorus::allreduce<chorus::recursive_doubling>(tp, v);
                    chorus::allreduce<chorus::rabenseifner>(tp, v);
                    ok = true;
                    for (float x : v) ok = ok && x == static_cast<float>(p * p * p);
                    check(ok, "allreduce<tree/rd/rabenseifner>" + at);
                }
                // broadcast from the last rank
                {
                    rank_t const root = p - 1;
                    std::vector<std::int32_t> v(n, -1);
                    if (me == root)
                        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(3 * i + 5);
                    chorus::broadcast(tp, v, root);
                    bool ok = true;
                    for (std::size_t i = 0; i < n; ++i) ok = ok && v[i] == static_cast<std::int32_t>(3 * i + 5);
                    check(ok, "broadcast" + at);
                }
                // scatter from rank 0: block r holds r*1000 + i
                {
                    std::vector<std::int32_t> send(P * n), recv(n);
                    for (std::size_t r = 0; r < P; ++r)
                        for (std::size_t i = 0; i < n; ++i) send[r * n + i] = static_cast<std::int32_t>(r * 1000 + i);
                    chorus::scatter(tp, send, recv, 0);
                    bool ok = true;
                    for (std::size_t i = 0; i < n; ++i) ok = ok && recv[i] == static_cast<std::int32_t>(M * 1000 + i);
                    check(ok, "scatter" + at);
                }
                // gather to rank 1, allgather
                {
                    std::vector<std::int32_t> send(n), recv(P * n, -1);
                    for (std::size_t i = 0; i < n; ++i) send[i] = static_cast<std::int32_t>(M * 1000 + i % 1000);
                    chorus::gather(tp, send, recv, 1);
                    bool ok = true;
                    if (me == 1)
                        for (std::size_t r = 0; r < P; ++r)
                            for (std::size_t i = 0; i < n; ++i)
                                ok = ok && recv[r * n + i] == static_cast<std::int32_t>(r * 1000 + i % 1000);
                    check(ok, "gather" + at);
                    std::vector<std::int32_t> all(P * n, -1);
                    chorus::allgather(tp, send, all);
                    ok = true;
                    for (std::size_t r = 0; r < P; ++r)
                        for (std::size_t i = 0; i < n; ++i)
                            ok = ok && all[r * n + i] == static_cast<std::int32_t>(r * 1000 + i % 1000);
                    check(ok, "allgather" + at);
                }
                // reduce to rank 0, reduce_scatter
                {
                    std::vector<std::int64_t> send(n), recv(n, -1);
                    for (std::size_t i = 0; i < n; ++i) send[i] = static_cast<std::int64_t>(M + i);
                    chorus::reduce(tp, send, recv, chorus::sum{}, 0);
                    bool ok = true;
                    if (me == 0)
                        for (std::size_t i = 0; i < n; ++i) ok = ok && recv[i] == expected_sum(i);
                    check(ok, "reduce" + at);
                    std::vector<std::int64_t> big(P * n), mine(n);
                    for (std::size_t i = 0; i < P * n; ++i) big[i] = static_cast<std::int64_t>(M + i);
                    chorus::reduce_scatter(tp, big, mine);
                    ok = true;
                    for (std::size_t i = 0; i < n; ++i) ok = ok && mine[i] == expected_sum(M * n + i);
                    check(ok, "reduce_scatter" + at);
                }
                // alltoall: block j of rank i is i*100 + j
                {
                    std::vector<std::int32_t> send(P * n), recv(P * n, -1);
                    for (std::size_t j = 0; j < P; ++j)
                        for (std::size_t i = 0; i < n; ++i) send[j * n + i] = static_cast<std::int32_t>(M * 100 + j);
                    chorus::alltoall(tp, send, recv);
                    bool ok = true;
                    for (std::size_t j = 0; j < P; ++j)
                        for (std::size_t i = 0; i < n; ++i) ok = ok && recv[j * n + i] == static_cast<std::int32_t>(j * 100 + M);
                    check(ok, "alltoall" + at);
                }
            }
            // alltoallv with the seed's splits (rank + j) % 3 + 1 (symmetric: i->j equals j->i)
            {
                std::vector<int> splits(static_cast<std::size_t>(p));
                int total = 0;
                for (rank_t j = 0; j < p; ++j) total += splits[static_cast<std::size_t>(j)] = (me + j) % 3 + 1;
                std::vector<float> send, recv(static_cast<std::size_t>(total), -1.0f);
                for (rank_t j = 0; j < p; ++j)
                    for (int k = 0; k < splits[static_cast<std::size_t>(j)]; ++k) send.push_back(static_cast<float>(me * 10 + j));
                chorus::alltoallv(tp, send, splits, recv, splits);
                std::vector<float> expected;
                for (rank_t i = 0; i < p; ++i)
                    for (int k = 0; k < splits[static_cast<std::size_t>(i)]; ++k) expected.push_back(static_cast<float>(i * 10 + me));
                check(recv == expected, "alltoallv");
            }
            chorus::barrier(tp);
        }, 20s);
        std::string all;
        for (auto const& f : failures) all += f + "\n";
        CHECK_MESSAGE(failures.empty(), all);
    }
}

// The progress engine's edge cases: a payload whose last byte ends a read budget (8 MiB per
// call), a message that streams in before its receive is posted (taken over mid-flight), a
// burst of small messages parsed from one staging buffer, and a send larger than the socket
// buffers while both ranks send first.
TEST_CASE("tcp: large, late-posted and bursty messages arrive whole and in order") {
    tcp_runner::run(2, [](chorus::tcp_transport& tp) {
        rank_t const peer = 1 - tp.rank();
        auto const pattern = [](rank_t from, std::size_t i, int round) {
            return static_cast<std::uint32_t>(from * 1000003 + static_cast<int>(i) * 7 + round);
        };
        for (std::size_t const bytes : {std::size_t{16} << 20, (std::size_t{16} << 20) + 12, std::size_t{3} << 20}) {
            for (int round = 0; round < 2; ++round) {
                std::vector<std::uint32_t> out(bytes / 4), in(bytes / 4, 0);
                for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern(tp.rank(), i, round);
                auto s = tp.isend(peer, 11, std::as_bytes(std::span(out)));
                if (round == 1) std::this_thread::sleep_for(30ms);  // the message is arriving unexpected
                auto r = tp.irecv(peer, 11, std::as_writable_bytes(std::span(in)));
                s.wait();
                r.wait();
                std::size_t wrong = 0;
                for (std::size_t i = 0; i < in.size(); ++i) wrong += in[i] != pattern(peer, i, round);
                CHECK(wrong == 0);
            }
        }
        // 2000 small messages with two tags, all sent before any receive is posted.
        constexpr int count = 2000;
        std::vector<std::uint64_t> values(count);
        std::vector<chorus::tcp_transport::request> sends;
        for (int i = 0; i < count; ++i) {
            values[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(tp.rank()) << 32 | static_cast<unsigned>(i);
            sends.push_back(tp.isend(peer, static_cast<chorus::tag_t>(20 + i % 2), std::as_bytes(std::span(&values[static_cast<std::size_t>(i)], 1))));
        }
        for (auto& s : sends) s.wait();
        std::this_thread::sleep_for(20ms);
        for (int tag = 21; tag >= 20; --tag) {  // the second tag first: matching is per tag
            for (int i = tag - 20; i < count; i += 2) {
                std::uint64_t got = 0;
                chorus::recv(tp, peer, std::span(&got, 1), static_cast<chorus::tag_t>(tag));
                REQUIRE(got == (static_cast<std::uint64_t>(peer) << 32 | static_cast<unsigned>(i)));
            }
        }
    }, 20s);
}

TEST_CASE("tcp: IPv6 loopback (::1)") {
    if (!ipv6_loopback_available()) {
        MESSAGE("::1 is not available here; skipped");
        return;
    }
    std::atomic<int> good{0};
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<std::int64_t> v(1000);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(static_cast<std::size_t>(tp.rank()) + i);
        chorus::allreduce(tp, v);
        bool ok = true;
        for (std::size_t i = 0; i < v.size(); ++i) ok = ok && v[i] == static_cast<std::int64_t>(3 * i + 3);
        if (ok) ++good;
    }, 10s, "::1");
    CHECK(good.load() == 3);
}

// The process's descriptor limit lowered to 256 (or its hard limit, if lower) for as long as
// this lives: the rendezvous's gate caps connections without a handshake at a quarter of it.
struct lowered_descriptor_limit {
    rlimit saved{};
    std::size_t gate_cap = 0;
    lowered_descriptor_limit() {
        REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
        rlimit low = saved;
        low.rlim_cur = std::min<rlim_t>(256, saved.rlim_max);
        gate_cap = std::max<std::size_t>(16, static_cast<std::size_t>(low.rlim_cur) / 4);
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    }
    ~lowered_descriptor_limit() { CHECK(::setrlimit(RLIMIT_NOFILE, &saved) == 0); }
    lowered_descriptor_limit(lowered_descriptor_limit const&) = delete;
    lowered_descriptor_limit& operator=(lowered_descriptor_limit const&) = delete;
};

TEST_CASE("tcp gate: a burst of silent connections over the cap turns its latest away, not an older one still in its handshake") {
    // The cap is a quarter of the descriptors the process may open: lowered to 256 here (64
    // strangers; fewer under a lower hard limit). Connection 0 stands for a rank whose answer
    // to the challenge is on its way; as many more as the cap arrive at once. Then, older than
    // the handshake allowance (1 s), connection 0 is the one to go when a later one comes.
    lowered_descriptor_limit const limit;
    std::size_t const cap = limit.gate_cap;
    {
        asio::io_context io;
        asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        chorus::detail::tcp_gate gate(io, 0, std::chrono::milliseconds(10000));
        std::vector<asio::ip::tcp::socket> clients;
        std::vector<std::shared_ptr<chorus::detail::tcp_incoming>> accepted;
        clients.reserve(cap + 2);
        auto const connect_one = [&] {
            clients.emplace_back(io).connect(acceptor.local_endpoint());
            auto c = std::make_shared<chorus::detail::tcp_incoming>(io);
            acceptor.accept(c->sock);
            gate.admit(c);
            accepted.push_back(c);
        };
        for (std::size_t i = 0; i <= cap; ++i) connect_one();  // one over the cap
        CHECK_MESSAGE(!accepted.front()->settled, "the connection still in its handshake was closed by a burst");
        CHECK(accepted.back()->settled);
        CHECK(std::ranges::count_if(accepted, [](auto const& c) { return c->settled; }) == 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        connect_one();
        CHECK_MESSAGE(accepted.front()->settled, "a connection silent for longer than a handshake stayed while a new one came");
        CHECK(!accepted.back()->settled);
        gate.close_all();
    }
}

TEST_CASE("tcp: ranks the master's gate turns away during a burst of silent connections connect again and join") {
    // The burst (the cap and 8 more: the cap is a quarter of the 256 descriptors allowed here)
    // reaches the master as it starts listening, before any rank's connection: each rank is
    // then the newest over the cap and is closed before the challenge, until the burst has been
    // silent for longer than a handshake takes (1 s) and its oldest go instead. A rank closed
    // so connects again rather than failing with "no challenge from the master".
    lowered_descriptor_limit const limit;
    std::size_t const cap = limit.gate_cap;
    {
        asio::io_context io;
        std::vector<asio::ip::tcp::socket> silent;
        std::atomic<int> good{0};
        auto const flood = [&](std::uint16_t port) {
            asio::ip::tcp::endpoint const master(asio::ip::make_address("127.0.0.1"), port);
            for (std::size_t i = 0; i < cap + 8; ++i) silent.emplace_back(io).connect(master);
        };
        auto const start = std::chrono::steady_clock::now();
        tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
            std::vector<int> v{tp.rank() + 1};
            chorus::allreduce(tp, v);
            if (v[0] == 6) ++good;
        }, 10s, "127.0.0.1", flood);
        CHECK(good.load() == 3);
        CHECK(std::chrono::steady_clock::now() - start >= 1s);  // they got in once the burst was old
    }
}

TEST_CASE("tcp: the handshake proves the token with HMAC-SHA256 of a fresh challenge, never sending it") {
    using chorus::detail::hmac_sha256;
    using chorus::detail::sha256;
    auto hex = [](auto const& digest) {
        std::string out;
        char buf[3];
        for (unsigned char b : digest) {
            std::snprintf(buf, sizeof buf, "%02x", b);
            out += buf;
        }
        return out;
    };
    // FIPS 180-4 and RFC 4231 vectors.
    CHECK(hex(sha256().update(std::string_view("abc")).finish()) ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(hex(sha256().update(std::string(1000000, 'a')).finish()) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    CHECK(hex(hmac_sha256("Jefe", std::string_view("what do ya want "), std::string_view("for nothing?"))) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    CHECK(hex(hmac_sha256(std::string(131, '\xaa'), std::string_view("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");

    namespace w = chorus::detail::tcp_wire;
    std::string const token = "the-secret-token";
    auto const a = w::make_challenge(), b = w::make_challenge();
    CHECK(a.value != b.value);  // fresh each time: an answer cannot be replayed
    auto const hello = w::encode_hello(1, 4, 5000, token, "10.0.0.1", a.value);
    CHECK(std::search(hello.begin(), hello.end(), token.begin(), token.end()) == hello.end());
    CHECK(hello != w::encode_hello(1, 4, 5000, token, "10.0.0.1", b.value));
    auto const mesh = w::encode_mesh(2, token, a.value);
    auto const m = w::decode_mesh(mesh.data());
    CHECK(m.rank == 2);
    CHECK(m.proof == w::mesh_mac(token, a.value, {mesh.data(), 16}));
    CHECK(m.proof != w::mesh_mac("another token", a.value, {mesh.data(), 16}));
    CHECK(w::decode_challenge(a.bytes.data()) == a.value);
}

TEST_CASE("tcp: stray connections to the master (garbage, wrong token, silent) are ignored") {
    asio::io_context io;
    std::vector<asio::ip::tcp::socket> strays;
    auto inject = [&](std::uint16_t port) {
        asio::ip::tcp::endpoint const ep(asio::ip::make_address("127.0.0.1"), port);
        auto connect = [&]() -> asio::ip::tcp::socket& {
            strays.emplace_back(io);
            strays.back().connect(ep);
            return strays.back();
        };
        std::vector<unsigned char> garbage(200, 0xab);
        asio::write(connect(), asio::buffer(garbage));
        // A well-formed hello for rank 1, but from another job: its mac, of another token (and
        // another nonce: the master's challenge is not read here, its loop is not running yet),
        // does not answer the master's challenge.
        namespace w = chorus::detail::tcp_wire;
        asio::write(connect(), asio::buffer(w::encode_hello(1, 3, 1234, "another-job", "127.0.0.1", w::nonce{})));
        // Huge lengths must not make the master allocate or wait for them.
        std::vector<unsigned char> huge;
        w::append64(huge, w::hello_magic);
        w::append64(huge, 2);
        w::append64(huge, 3);
        w::append64(huge, 1234);
        w::append64(huge, std::uint64_t{1} << 40);
        asio::write(connect(), asio::buffer(huge));
        connect();  // connects and says nothing, held open for the whole job
    };
    std::atomic<int> good{0};
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<int> v(10, 1);
        chorus::allreduce(tp, v);
        if (v == std::vector<int>(10, 3)) ++good;
    }, 10s, "127.0.0.1", inject);
    CHECK(good.load() == 3);
    CHECK(strays.size() == 4);
}

/// Starts ranks 0..started-1 of a group of `size` whose rendezvous is to fail (rank 0 with a
/// 500 ms timeout, the others 2 s, so that rank 0 gives up first), `tweak` adjusting each rank's
/// config; returns what each rank's constructor threw.
static std::vector<conformance::outcome> failed_rendezvous(rank_t started, rank_t size,
                                                    std::function<void(chorus::tcp_config&)> tweak = {}) {
    std::mutex mutex;
    std::vector<conformance::outcome> seen(static_cast<std::size_t>(started));
    std::promise<std::uint16_t> port_promise;
    auto port = port_promise.get_future().share();
    std::vector<std::thread> threads;
    for (rank_t r = 0; r < started; ++r)
        threads.emplace_back([&, r] {
            try {
                chorus::tcp_config c;
                c.rank = r;
                c.size = size;
                c.timeout = r == 0 ? 500ms : 2000ms;
                c.job_token = "t";
                if (tweak) tweak(c);
                if (r == 0) c.on_master_listening = [&](std::uint16_t p) { port_promise.set_value(p); };
                else c.master_port = port.get();
                chorus::tcp_transport tp(std::move(c));
            } catch (chorus::transport_error const& e) {
                std::lock_guard lock(mutex);
                seen[static_cast<std::size_t>(r)] = {true, e.code(), e.peer(), e.what()};
            }
        });
    for (auto& t : threads) t.join();
    return seen;
}

TEST_CASE("tcp: a rank that never starts makes the rendezvous time out, naming it on every rank") {
    auto const start = std::chrono::steady_clock::now();
    auto const seen = failed_rendezvous(2, 3);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    CHECK(seen[0].threw);
    CHECK(seen[0].code == chorus::errc::timeout);
    CHECK(seen[0].peer == 2);
    CHECK(seen[0].what.find("never joined: 2") != std::string::npos);
    // Rank 1 learns it from the master, not from a timeout or a closed connection of its own.
    CHECK(seen[1].threw);
    CHECK(seen[1].code == chorus::errc::timeout);
    CHECK(seen[1].peer == 2);
    CHECK_MESSAGE(seen[1].what.find("rank 1: the rendezvous failed at the master (rank 0)") != std::string::npos, seen[1].what);
    CHECK(seen[1].what.find("never joined: 2") != std::string::npos);
}

TEST_CASE("tcp: a rank whose hello the master closed unanswered says it again; a master that stopped listening fails it at once") {
    // A stand-in master: it takes rank 1's hello and closes the connection without an answer,
    // as its gate does with a hello that packet loss held up past its grace; the rank must
    // connect and say it again. Then it stops listening, as a master that exited: the rank must
    // say so at once, not wait out its 20 s deadline.
    namespace w = chorus::detail::tcp_wire;
    asio::io_context io;
    asio::ip::tcp::acceptor master(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    auto const port = master.local_endpoint().port();
    int hellos = 0;
    std::function<void()> serve = [&] {
        auto s = std::make_shared<asio::ip::tcp::socket>(io);
        master.async_accept(*s, [&, s](asio::error_code e) {
            if (e) return;
            auto const challenge = std::make_shared<w::challenge>(w::make_challenge());
            auto const head = std::make_shared<std::array<unsigned char, w::hello_head_size>>();
            asio::async_write(*s, asio::buffer(challenge->bytes), [](asio::error_code, std::size_t) {});
            asio::async_read(*s, asio::buffer(*head), [&, s, head](asio::error_code e2, std::size_t) {
                if (e2) return;
                auto const h = w::decode_hello(head->data());
                auto const rest = std::make_shared<std::vector<unsigned char>>(w::mac_size + std::min<std::size_t>(h.addr_len, w::max_addr));
                asio::async_read(*s, asio::buffer(*rest), [&, s, rest, h](asio::error_code e3, std::size_t) {
                    if (!e3 && h.magic == w::hello_magic && h.rank == 1 && h.size == 2) ++hellos;
                    s->close();  // unanswered
                    if (hellos < 2) return serve();
                    master.close();
                });
            });
        });
    };
    serve();
    // Bounded, so that a rank that gives up at the first close fails the test, not hangs it.
    std::thread fake([&] {
        io.run_for(15s);
        master.close();
    });
    std::optional<conformance::outcome> seen;
    auto const start = std::chrono::steady_clock::now();
    try {
        chorus::tcp_config c;
        c.rank = 1;
        c.size = 2;
        c.timeout = 20s;
        c.job_token = "t";
        c.master_port = port;
        chorus::tcp_transport tp(std::move(c));
    } catch (chorus::transport_error const& e) {
        seen = conformance::outcome{true, e.code(), e.peer(), e.what()};
    }
    auto const took = std::chrono::steady_clock::now() - start;
    fake.join();
    CHECK(hellos == 2);
    REQUIRE(seen);
    CHECK(took < 10s);
    CHECK(seen->code == chorus::errc::connection_failed);
    CHECK_MESSAGE(seen->what.find("stopped listening during the rendezvous") != std::string::npos, seen->what);
}

TEST_CASE("tcp: a link that never connects is named by every rank, not the rank whose deadline came first") {
    // Rank 2 advertises an address nobody can reach: rank 3 never connects to it. Ranks 2 and 3
    // give up after 1.5 s, ranks 0 and 1 would wait 6 s; the first of 2 and 3 to give up tells
    // the ranks holding its connections that its rendezvous failed (not that it exited), and
    // they name the end of the broken link they miss, at once.
    auto const start = std::chrono::steady_clock::now();
    auto const seen = failed_rendezvous(4, 4, [](chorus::tcp_config& c) {
        c.timeout = c.rank >= 2 ? 1500ms : 6000ms;
        if (c.rank == 2) c.advertise_addr = "192.0.2.1";  // TEST-NET-1: never answers
    });
    CHECK(std::chrono::steady_clock::now() - start < 4s);
    for (rank_t r = 0; r < 4; ++r) {
        auto const& o = seen[static_cast<std::size_t>(r)];
        CAPTURE(r);
        CAPTURE(o.what);
        CHECK(o.threw);
        CHECK(o.code == chorus::errc::timeout);
        if (r < 2) CHECK((o.peer == 2 || o.peer == 3));
    }
    CHECK(seen[2].peer == 3);
    CHECK(seen[3].peer == 2);
    CHECK(seen[3].what.find("no connection with ranks: 2") != std::string::npos);
}

TEST_CASE("tcp: a rank with another job's token is told so by the master") {
    auto const seen = failed_rendezvous(2, 2, [](chorus::tcp_config& c) {
        if (c.rank == 1) c.job_token = "another job";
    });
    CHECK(seen[0].threw);
    CHECK(seen[0].what.find("never joined: 1") != std::string::npos);
    CHECK(seen[1].threw);
    CHECK(seen[1].code == chorus::errc::connection_failed);
    CHECK_MESSAGE(seen[1].what.find("the master refused this rank: wrong job token") != std::string::npos, seen[1].what);
}

TEST_CASE("tcp: two jobs on one master port never join: the second master says the port is taken, its ranks are refused") {
    // Job B (another token) starts on job A's port while A's rendezvous runs (A's rank 2 joins
    // only once B is over): B's master cannot listen, B's rank 1 reaches A's master and is
    // refused; A goes on untouched.
    conformance::outcomes job_b(2);
    std::vector<std::thread> b;
    std::promise<void> b_started;
    std::shared_future<void> started = b_started.get_future().share();
    std::vector<int> sums;
    std::mutex mutex;
    auto start_b = [&](std::uint16_t port) {
        for (rank_t r = 0; r < 2; ++r)
            b.emplace_back([&, r, port] {
                chorus::tcp_config c;
                c.rank = r;
                c.size = 2;
                c.master_port = port;
                c.timeout = 20s;
                c.job_token = "job B";
                job_b.record(r, [&] { chorus::tcp_transport never(std::move(c)); });
            });
        b_started.set_value();
    };
    auto rank_2_after_b = [&](chorus::tcp_config& c) {
        if (c.rank != 2) return;
        started.wait();
        for (auto& t : b) t.join();
    };
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<int> v{tp.rank() + 1};
        chorus::allreduce(tp, v);
        std::lock_guard lock(mutex);
        sums.push_back(v[0]);
    }, 20s, "127.0.0.1", start_b, -1, rank_2_after_b);
    CHECK(sums == std::vector<int>{6, 6, 6});  // A is untouched
    REQUIRE(job_b[0].threw);
    CHECK_MESSAGE(job_b[0].what.find("the port is in use") != std::string::npos, job_b[0].what);
    REQUIRE(job_b[1].threw);
    CHECK_MESSAGE(job_b[1].what.find("wrong job token") != std::string::npos, job_b[1].what);
}

TEST_CASE("tcp: a message over CHORUS_MAX_MESSAGE_BYTES before its receive fails the group naming its sender") {
    // Rank 0 accepts at most 1000 unexpected bytes: 1000 arrive unasked and are delivered, 4000
    // arrive unasked and fail the group on both ranks before anything is allocated for them;
    // 4000 into a posted receive are not limited.
    for (bool const posted_first : {true, false}) {
        CAPTURE(posted_first);
        conformance::outcomes seen(2);
        tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
            seen.record(tp.rank(), [&] {
                std::vector<std::uint32_t> small(250, 7), large(1000, 9);
                if (tp.rank() == 1) {
                    chorus::send(tp, 0, small, 1);
                    chorus::send(tp, 0, large, 2);
                    chorus::barrier(tp);
                    return;
                }
                std::vector<std::uint32_t> in(1000);
                auto r = posted_first ? std::optional(chorus::irecv(tp, 1, in, 2)) : std::nullopt;
                std::this_thread::sleep_for(100ms);  // both messages reach rank 0 meanwhile
                std::vector<std::uint32_t> got(250);
                chorus::recv(tp, 1, got, 1);
                CHECK(got == small);
                if (!r) r.emplace(chorus::irecv(tp, 1, in, 2));
                r->wait();
                CHECK(in == large);
                chorus::barrier(tp);
            });
        }, 5s, "127.0.0.1", {}, -1, [](chorus::tcp_config& c) { c.max_message_bytes = 1000; });
        for (rank_t r : {0, 1}) {
            CAPTURE(r);
            CHECK(seen[r].threw != posted_first);
            if (!posted_first)
                CHECK_MESSAGE(seen[r].what.find("rank 1 sent a message of 4000 bytes (tag 2) before its receive was posted, "
                                                "more than CHORUS_MAX_MESSAGE_BYTES = 1000") != std::string::npos,
                              seen[r].what);
        }
    }
}

TEST_CASE("tcp: flow control: past CHORUS_MAX_UNEXPECTED_BYTES a send waits for its receive, and arrives whole") {
    // Rank 0 holds at most 64 KiB for receives not yet posted. Rank 1 sends three 24 MiB
    // messages (more than the sockets buffer) while rank 0 waits for rank 2 (300 ms), driving
    // every socket: without flow control rank 0 would read them all into its memory, and rank
    // 1's first send would complete before rank 0 posted its receive.
    constexpr std::size_t n = 6u << 20;  // ints: 24 MiB
    std::atomic<bool> posted{false};
    std::atomic<bool> completed_before_posted{false};
    std::vector<std::vector<int>> got(3, std::vector<int>(n));
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<int> token{1};
        if (tp.rank() == 1) {
            std::vector<std::vector<int>> out(3, std::vector<int>(n));
            std::vector<chorus::tcp_transport::request> sends;
            for (std::size_t m = 0; m < 3; ++m) {
                std::iota(out[m].begin(), out[m].end(), static_cast<int>(m) * 7);
                sends.push_back(tp.isend(0, chorus::tag_t(m + 1), std::as_bytes(std::span(out[m]))));
            }
            sends[0].wait();
            if (!posted) completed_before_posted = true;
            for (auto& s : sends) s.wait();
        } else if (tp.rank() == 2) {
            std::this_thread::sleep_for(300ms);
            chorus::send(tp, 0, token, 9);
        } else {
            chorus::recv(tp, 2, token, 9);
            posted = true;
            for (std::size_t m = 0; m < 3; ++m) chorus::recv(tp, 1, got[m], chorus::tag_t(m + 1));
        }
        chorus::barrier(tp);
    }, 20s, "127.0.0.1", {}, -1, [](chorus::tcp_config& c) { c.max_unexpected_bytes = 64 << 10; });
    CHECK_FALSE(completed_before_posted.load());  // it waited for the receive, not in rank 0's memory
    for (std::size_t m = 0; m < 3; ++m) {
        CAPTURE(m);
        int const first = static_cast<int>(m) * 7;
        CHECK(got[m][0] == first);
        CHECK(got[m][n / 2] == static_cast<int>(n / 2) + first);
        CHECK(got[m][n - 1] == static_cast<int>(n - 1) + first);
    }
}

TEST_CASE("tcp: flow control: a held message that no receive takes times out naming its sender") {
    // Rank 1 sends a large message nobody receives, then a small one rank 0 waits for: the small
    // one is behind the held one (as under MPI's rendezvous protocol), so rank 0 times out and
    // names the held message and its sender.
    conformance::outcomes seen(2);
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        std::vector<int> big(1 << 18, 1), small{5};  // 1 MiB: the sockets take it whole, the send completes
        if (tp.rank() == 1) {
            chorus::send(tp, 0, big, 11);
            chorus::send(tp, 0, small, 12);
            std::this_thread::sleep_for(2500ms);  // in the group (leaving would end it sooner)
        } else {
            seen.record(0, [&] { chorus::recv(tp, 1, small, 12); });
        }
    }, 1500ms, "127.0.0.1", {}, -1, [](chorus::tcp_config& c) { c.max_unexpected_bytes = 1024; });
    REQUIRE(seen[0].threw);
    CHECK(seen[0].code == chorus::errc::peer_failed);
    CHECK(seen[0].peer == 1);
    CHECK_MESSAGE(seen[0].what.find("rank 1 sent a message of 1048576 bytes (tag 11) that no receive took") != std::string::npos,
                  seen[0].what);
}

TEST_CASE("tcp: a peer's abort reason arrives with its control characters escaped") {
    conformance::outcomes seen(2);
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        if (tp.rank() == 1) return tp.abort("forged\n[rank0] all good\x1b[2K\r");
        std::vector<int> v(1);
        seen.record(0, [&] { chorus::recv(tp, 1, v, 3); });
    }, 5s);
    CHECK(seen[0].threw);
    CHECK(seen[0].what.find("forged\\n[rank0] all good\\x1b[2K\\r") != std::string::npos);
    CHECK(seen[0].what.find_first_of("\n\r\x1b") == std::string::npos);
}

TEST_CASE("tcp: a rank that leaves early fails the receive waiting for it at once, naming it") {
    conformance::outcomes seen(2);
    std::atomic<long long> failed_after_ms{-1};
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        if (tp.rank() == 1) return;  // leaves at once: goodbye, end of stream
        auto const start = std::chrono::steady_clock::now();
        std::vector<int> v(1);
        seen.record(0, [&] { chorus::recv(tp, 1, v, 3); });
        failed_after_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    }, 20s);
    REQUIRE(seen[0].threw);
    CHECK(seen[0].code == chorus::errc::peer_failed);
    CHECK(seen[0].peer == 1);
    CHECK_MESSAGE(seen[0].what.find("rank 1 left the group") != std::string::npos, seen[0].what);
    CHECK(failed_after_ms.load() < 10000);  // not the 20 s timeout (a generous margin under load)
}

TEST_CASE("tcp: a rank that leaves early does not wait for the others, who go on without it") {
    std::atomic<long long> leave_ms{-1};
    std::vector<int> got(1, -1);
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        if (tp.rank() == 2) {  // done at once: its transport goes while the others still work
            chorus::tcp_transport mine(std::move(tp));
            auto const start = std::chrono::steady_clock::now();
            { auto gone = std::move(mine); }
            leave_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
            return;
        }
        std::this_thread::sleep_for(1500ms);  // outlives rank 2's leaving by far
        std::vector<int> v{tp.rank() + 10};
        if (tp.rank() == 0) chorus::recv(tp, 1, got, 4);
        else chorus::send(tp, 0, v, 4);
    }, 20s);
    CHECK(got[0] == 11);
    CHECK(leave_ms.load() >= 0);
    CHECK(leave_ms.load() < 1000);  // did not wait for goodbyes from ranks still at work
}

TEST_CASE("tcp: a transport destroyed by an exception aborts the group with the reason") {
    conformance::outcomes seen(2);
    CHECK_THROWS_WITH(tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        if (tp.rank() == 1) {
            chorus::tcp_transport mine(std::move(tp));  // the runner's own abort then finds nothing
            throw std::runtime_error("a check of the user's failed");
        }
        std::vector<int> v(1);
        seen.record(0, [&] { chorus::recv(tp, 1, v, 3); });
    }, 20s), "a check of the user's failed");
    REQUIRE(seen[0].threw);
    CHECK(seen[0].code == chorus::errc::peer_failed);
    CHECK(seen[0].peer == 1);
    CHECK_MESSAGE(seen[0].what.find("rank 1 left the group by an exception") != std::string::npos, seen[0].what);
}

TEST_CASE("tcp: liveness: a rank computing longer than the heartbeat limit is alive, CHORUS_TIMEOUT_MS=0 waits") {
    // Heartbeats every 50 ms, silence limit 250 ms: rank 1 computes for 1.2 s outside the
    // transport (its heartbeat thread keeps beating) and rank 0 waits for it with no timeout.
    std::vector<int> got(1, -1);
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        std::vector<int> v{42};
        if (tp.rank() == 1) {
            std::this_thread::sleep_for(1200ms);
            chorus::send(tp, 0, v, 5);
        } else {
            chorus::recv(tp, 1, got, 5);
        }
        chorus::barrier(tp);
    }, 0ms, "127.0.0.1", {}, -1, [](chorus::tcp_config& c) { c.heartbeat = 50ms; });
    CHECK(got[0] == 42);
}

TEST_CASE("tcp: destroying a pending receive aborts the group on every rank") {
    std::mutex mutex;
    std::vector<conformance::outcome> seen(2);
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        std::vector<int> v(4, -1);
        try {
            if (tp.rank() == 0) {
                { auto r = tp.irecv(1, 8, std::as_writable_bytes(std::span(v))); }  // abandoned
                chorus::recv(tp, 1, v, 9);
            } else {
                chorus::recv(tp, 0, v, 9);
            }
        } catch (chorus::transport_error const& e) {
            std::lock_guard lock(mutex);
            seen[static_cast<std::size_t>(tp.rank())] = {true, e.code(), e.peer(), e.what()};
        }
        if (v != std::vector<int>(4, -1)) throw std::runtime_error("buffer written after cancel");
    }, 5s);
    CHECK(seen[0].code == chorus::errc::aborted);
    CHECK(seen[1].code == chorus::errc::peer_failed);
    CHECK(seen[1].peer == 0);
    CHECK(seen[1].what.find("abandoned") != std::string::npos);
}

TEST_CASE("tcp: from_env reads the launcher's variables and names missing ones") {
    unset_launcher_env();
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::from_env(), doctest::Contains("RANK"), chorus::invalid_argument);
    ::setenv("SLURM_PROCID", "0", 1);
    ::setenv("SLURM_NTASKS", "1", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::from_env(), doctest::Contains("MASTER_PORT"), chorus::invalid_argument);
    ::setenv("MASTER_PORT", "29500", 1);
    ::setenv("CHORUS_TIMEOUT_MS", "1000", 1);
    {
        auto tp = chorus::tcp_transport::from_env();  // a group of one: no sockets needed
        CHECK(tp.rank() == 0);
        CHECK(tp.size() == 1);
        CHECK(tp.timeout() == 1000ms);
        std::vector<int> v{1, 2}, w(2);
        chorus::sendrecv(tp, 0, v, 0, w);
        CHECK(w == v);
    }
    ::setenv("CHORUS_TIMEOUT_MS", "soon", 1);
    CHECK_THROWS_AS(chorus::tcp_transport::from_env(), chorus::invalid_argument);
    for (char const* v : {"SLURM_PROCID", "SLURM_NTASKS", "MASTER_PORT", "CHORUS_TIMEOUT_MS"}) ::unsetenv(v);
}

TEST_CASE("tcp: config_from_env: torchrun, Slurm and Open MPI variables, CHORUS_* settings") {
    unset_launcher_env();
    ::setenv("RANK", "2", 1);
    ::setenv("WORLD_SIZE", "4", 1);
    ::setenv("LOCAL_RANK", "1", 1);
    ::setenv("MASTER_ADDR", "[::1]", 1);
    ::setenv("MASTER_PORT", "1234", 1);
    ::setenv("CHORUS_PORT_RANGE", "30000-30010", 1);
    ::setenv("CHORUS_SOCKET_IFNAME", "eth7", 1);
    ::setenv("CHORUS_TCP_CONGESTION", "cubic", 1);
    ::setenv("CHORUS_JOB_TOKEN", "secret", 1);
    ::setenv("CHORUS_MASTER_FD", "7", 1);  // rank 2: not the master, ignored
    auto c = chorus::tcp_transport::config_from_env();
    CHECK(c.rank == 2);
    CHECK(c.size == 4);
    CHECK(c.local_rank == 1);
    CHECK(c.master_addr == "[::1]");  // brackets are stripped by the transport
    CHECK(c.master_port == 1234);
    CHECK(c.port_min == 30000);
    CHECK(c.port_max == 30010);
    CHECK(c.socket_ifname == "eth7");
    CHECK(c.congestion == "cubic");
    CHECK(c.job_token == "secret");
    CHECK(c.master_fd == -1);
    CHECK(c.spin == 50us);  // the default
    CHECK(c.max_message_bytes == 0);  // the default: half the host's memory
    ::setenv("CHORUS_MAX_MESSAGE_BYTES", "4096", 1);
    CHECK(chorus::tcp_transport::config_from_env().max_message_bytes == 4096);
    ::setenv("CHORUS_MAX_MESSAGE_BYTES", "0", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_MAX_MESSAGE_BYTES must be positive"),
                         chorus::invalid_argument);
    ::unsetenv("CHORUS_MAX_MESSAGE_BYTES");
    ::setenv("CHORUS_SPIN_US", "0", 1);
    CHECK(chorus::tcp_transport::config_from_env().spin == 0us);
    ::setenv("CHORUS_SPIN_US", "-5", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_SPIN_US"), chorus::invalid_argument);
    ::setenv("CHORUS_SPIN_US", "lots", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_SPIN_US"), chorus::invalid_argument);
    ::unsetenv("CHORUS_SPIN_US");
    // Read by host_memory::copy once per process; a bad value fails here, naming the reader.
    ::setenv("CHORUS_NT_COPY_BYTES", "1M", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(),
                         doctest::Contains("tcp_transport::from_env: CHORUS_NT_COPY_BYTES is not a number"), chorus::invalid_argument);
    ::setenv("CHORUS_NT_COPY_BYTES", "-1", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_NT_COPY_BYTES"), chorus::invalid_argument);
    ::setenv("CHORUS_NT_COPY_BYTES", "0", 1);
    CHECK_NOTHROW(chorus::tcp_transport::config_from_env());
    ::unsetenv("CHORUS_NT_COPY_BYTES");
    ::setenv("CHORUS_PORT_RANGE", "30010-30000", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_PORT_RANGE"), chorus::invalid_argument);
    ::setenv("CHORUS_PORT_RANGE", "30000", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("LOW-HIGH"), chorus::invalid_argument);
    ::setenv("CHORUS_PORT_RANGE", "1-70000", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("out of range"), chorus::invalid_argument);
    ::unsetenv("CHORUS_PORT_RANGE");
    ::setenv("CHORUS_TIMEOUT_MS", "0", 1);  // no collective timeout; liveness and the set-up bound stay
    ::setenv("CHORUS_HEARTBEAT_MS", "250", 1);
    c = chorus::tcp_transport::config_from_env();
    CHECK(c.timeout == 0ms);
    CHECK(c.heartbeat == 250ms);
    CHECK(chorus::detail::setup_timeout(c) == 30000ms);
    ::setenv("CHORUS_TIMEOUT_MS", "-1", 1);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_TIMEOUT_MS"), chorus::invalid_argument);
    ::setenv("CHORUS_HEARTBEAT_MS", "soon", 1);
    ::unsetenv("CHORUS_TIMEOUT_MS");
    CHECK_THROWS_WITH_AS(chorus::tcp_transport::config_from_env(), doctest::Contains("CHORUS_HEARTBEAT_MS"), chorus::invalid_argument);
    ::unsetenv("CHORUS_HEARTBEAT_MS");

    // Slurm: no MASTER_*; the master is the first node of the job, the port follows the job id.
    unset_launcher_env();
    ::setenv("SLURM_PROCID", "3", 1);
    ::setenv("SLURM_NTASKS", "8", 1);
    ::setenv("SLURM_LOCALID", "1", 1);
    ::setenv("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu3", 1);
    ::setenv("SLURM_JOB_ID", "123456", 1);
    c = chorus::tcp_transport::config_from_env();
    CHECK(c.rank == 3);
    CHECK(c.size == 8);
    CHECK(c.local_rank == 1);
    CHECK(c.master_addr == "gpu07");
    CHECK(c.master_port == 10000 + (123456 % 50000 * 131) % 50000);
    CHECK(c.job_token == "slurm:123456.batch");  // no CHORUS_JOB_TOKEN: the job is the token
    // Two steps of one allocation running at once: their own ports and tokens.
    ::setenv("SLURM_STEP_ID", "0", 1);
    auto const step0 = chorus::tcp_transport::config_from_env();
    ::setenv("SLURM_STEP_ID", "1", 1);
    auto const step1 = chorus::tcp_transport::config_from_env();
    CHECK(step0.master_port != step1.master_port);
    CHECK(step0.job_token == "slurm:123456.0");
    CHECK(step1.job_token == "slurm:123456.1");
    ::setenv("CHORUS_JOB_TOKEN", "secret", 1);  // an explicit token wins
    CHECK(chorus::tcp_transport::config_from_env().job_token == "secret");

    // torchrun's run id and Open MPI's namespace identify their jobs the same way.
    unset_launcher_env();
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "1", 1);
    ::setenv("MASTER_PORT", "29500", 1);
    CHECK(chorus::tcp_transport::config_from_env().job_token.empty());
    ::setenv("PMIX_NAMESPACE", "prterun-host-1234@1", 1);
    CHECK(chorus::tcp_transport::config_from_env().job_token == "ompi:prterun-host-1234@1");
    ::setenv("TORCHELASTIC_RUN_ID", "job-7", 1);
    CHECK(chorus::tcp_transport::config_from_env().job_token == "torchelastic:job-7");

    // Open MPI's names.
    unset_launcher_env();
    ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    ::setenv("MASTER_PORT", "29501", 1);
    ::setenv("CHORUS_MASTER_FD", "9", 1);
    c = chorus::tcp_transport::config_from_env();
    CHECK(c.rank == 0);
    CHECK(c.size == 2);
    CHECK(c.master_addr == "127.0.0.1");
    CHECK(c.master_fd == 9);  // rank 0 takes the launcher's socket
    unset_launcher_env();
}

TEST_CASE("tcp: the first host of a Slurm node list") {
    using chorus::detail::first_slurm_host;
    CHECK(first_slurm_host("node01") == "node01");
    CHECK(first_slurm_host("a1,b2") == "a1");
    CHECK(first_slurm_host("n[1-4]") == "n1");
    CHECK(first_slurm_host("n[05,07],m1") == "n05");
    CHECK(first_slurm_host("rack[3-4]-node,x") == "rack3-node");
}

TEST_CASE("tcp: a launcher's listening socket (CHORUS_MASTER_FD) serves the rendezvous") {
    auto [fd, port] = listening_socket();
    std::atomic<int> done{0};
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<int> v{tp.rank()};
        chorus::allreduce(tp, v);
        CHECK(v[0] == 3);
        ++done;
    }, 10s, "127.0.0.1", {}, -1, [fd = fd, port = port](chorus::tcp_config& c) {
        if (c.rank == 0) c.master_fd = fd;  // the transport owns it from here
        c.master_port = port;
    });
    CHECK(done == 3);
    int pipe_fds[2] = {-1, -1};
    REQUIRE(::pipe(pipe_fds) == 0);
    ::close(pipe_fds[1]);
    chorus::tcp_config c;
    c.size = 2;
    c.master_fd = pipe_fds[0];
    c.timeout = 2s;
    CHECK_THROWS_WITH_AS(chorus::tcp_transport{c}, doctest::Contains("not a listening TCP socket"), chorus::transport_error);
}

TEST_CASE("tcp: CHORUS_SOCKET_IFNAME picks the advertised address, CHORUS_PORT_RANGE bounds the listeners") {
    auto [fd, taken] = listening_socket();  // a port nobody else can bind while we hold it
    std::atomic<int> done{0};
    // Listeners in [taken, taken + 63]: the first is in use, so every rank moves on to a free one.
    tcp_runner::run(3, [&](chorus::tcp_transport& tp) {
        std::vector<int> v{1};
        chorus::allreduce(tp, v);
        CHECK(v[0] == 3);
        ++done;
    }, 10s, "127.0.0.1", {}, -1, [taken = taken](chorus::tcp_config& c) {
        c.socket_ifname = "lo";
        c.port_min = taken;
        c.port_max = static_cast<std::uint16_t>(std::min(65535, taken + 63));
    });
    CHECK(done == 3);

    chorus::tcp_config c;
    c.size = 2;
    c.master_port = 1;  // never reached: the listener fails first
    c.timeout = 2s;
    c.port_min = c.port_max = taken;
    std::string const busy = "cannot listen on any port of " + std::to_string(taken);
    CHECK_THROWS_WITH_AS(chorus::tcp_transport{c}, doctest::Contains(busy.c_str()), chorus::transport_error);
    ::close(fd);
    c.port_min = c.port_max = 0;
    c.socket_ifname = "chorus-none0";
    CHECK_THROWS_WITH_AS(chorus::tcp_transport{c}, doctest::Contains("interface 'chorus-none0'"), chorus::transport_error);
}

// tcp_stats, and where a payload lands: a message whose receive was posted first goes straight
// into the receive's buffer (counted direct or staged), one sent before its receive was posted
// is held (counted unexpected) — here wholly, as the barrier's message queued behind it cannot
// be read before it.
TEST_CASE("tcp: stats count the bytes and calls, and where payloads landed") {
    constexpr std::size_t bytes = (std::size_t{1} << 20) + 12;
    tcp_runner::run(2, [&](chorus::tcp_transport& tp) {
        rank_t const peer = 1 - tp.rank();
        std::vector<std::byte> out(bytes, std::byte{7}), in(bytes);
        auto const a = tp.stats();
        if (tp.rank() == 1) {  // receive posted first
            auto r = tp.irecv(peer, 5, in);
            chorus::barrier(tp);
            r.wait();
        } else {
            chorus::barrier(tp);
            tp.isend(peer, 5, out).wait();
        }
        chorus::barrier(tp);
        auto const b = tp.stats();
        chorus::barrier(tp);  // nothing of the next message is sent before b is taken
        if (tp.rank() == 1) {  // sent first
            chorus::barrier(tp);
            tp.irecv(peer, 6, in).wait();
        } else {
            auto s = tp.isend(peer, 6, out);
            chorus::barrier(tp);
            s.wait();
        }
        auto const c = tp.stats();
        if (tp.rank() == 0) {
            CHECK(b.bytes_sent - a.bytes_sent > bytes);  // the payload, its header, the barrier's
            CHECK(c.bytes_sent - b.bytes_sent > bytes);
            CHECK(b.send_calls > a.send_calls);
            CHECK(c.bytes_unexpected == 0);
        } else {
            CHECK(std::ranges::all_of(in, [](std::byte x) { return x == std::byte{7}; }));
            CHECK(b.bytes_received - a.bytes_received > bytes);
            CHECK(b.recv_calls > a.recv_calls);
            CHECK((b.bytes_direct - a.bytes_direct) + (b.bytes_staged - a.bytes_staged) == bytes);
            CHECK(b.bytes_unexpected == a.bytes_unexpected);
            CHECK(c.bytes_unexpected - b.bytes_unexpected == bytes);
            CHECK(c.bytes_direct + c.bytes_staged == b.bytes_direct + b.bytes_staged);
        }
        CHECK(c.recv_empty <= c.recv_calls);
        CHECK(c.send_full <= c.send_calls);
        CHECK(c.sleeps <= c.polls);
    }, 20s);
}

namespace {
std::string congestion_of(asio::ip::tcp::socket& s) {
    char name[32] = {};
    socklen_t len = sizeof name;
    if (::getsockopt(s.native_handle(), IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
    return std::string(name, ::strnlen(name, len));
}
}  // namespace

TEST_CASE("tcp: connections inside one host use Reno unless CHORUS_TCP_CONGESTION says otherwise") {
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
    asio::ip::tcp::socket client(io), server(io);
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
    CHECK(chorus::detail::same_host(client));
    std::string system;
    if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
        char line[64] = {};
        if (std::fgets(line, sizeof line, f)) system = std::string(line, ::strcspn(line, "\n"));
        std::fclose(f);
    }
    CHECK(chorus::detail::tune_socket(client, "system").empty());
    if (!system.empty()) CHECK(congestion_of(client) == system);
    CHECK(chorus::detail::tune_socket(client, "").empty());
    CHECK(congestion_of(client) == "reno");  // always built in, and always allowed
    CHECK(chorus::detail::tune_socket(server, "reno").empty());
    CHECK(congestion_of(server) == "reno");
    std::string const why = chorus::detail::tune_socket(client, "no-such-algorithm");
    CHECK(why.find("CHORUS_TCP_CONGESTION=no-such-algorithm cannot be set") != std::string::npos);

    // Through the transport: every rank refuses the name before the rendezvous (a rank that
    // only accepts connections must not wait for peers that gave up).
    for (rank_t r : {0, 1}) {
        chorus::tcp_config c;
        c.rank = r;
        c.size = 2;
        c.master_port = 1;  // never reached
        c.congestion = "no-such-algorithm";
        CHECK_THROWS_WITH_AS(chorus::tcp_transport{c}, doctest::Contains("CHORUS_TCP_CONGESTION=no-such-algorithm cannot be set"),
                             chorus::invalid_argument);
    }
    chorus::tcp_config ok;
    ok.congestion = "reno";  // allowed everywhere: a group of one forms
    CHECK_NOTHROW(chorus::tcp_transport{ok});
}

// Every algorithm of the collectives one_shot serves (one_shot included: shm is a
// direct_transport), every op and type, sizes {0, 1, p-1, p+1, 4099}: with 16 KiB rounds (4099
// doubles take two) and with 64-byte rounds (alltoall at 4 ranks: 2 doubles of every block per
// round, 2050 rounds). Two test cases: thousands of rounds of 4 threads each slow down many
// times over on a loaded 2-core machine, and each must stay well inside ctest's timeout.
template <class Runner>
void shm_one_shot_matrix() {
    for (rank_t p : {1, 2, 3, 4}) {
        CAPTURE(p);
        oracle::failures f;
        Runner::run(p, [&](chorus::shm_transport& tp) { checks::one_shot_collectives(tp, f); }, std::chrono::milliseconds(60000));
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

TEST_CASE("shm: one_shot collectives in one round of 16 KiB (or two) agree with the oracle, at 1 to 4 ranks") {
    shm_one_shot_matrix<shm_runner>();
}

TEST_CASE("shm: one_shot collectives in many rounds of 64 bytes agree with the oracle, at 1 to 4 ranks") {
    shm_one_shot_matrix<shm_rounds_runner>();
}

TEST_CASE("staged over shared memory (cuda_ipc_transport's control channel): one_shot rounds and messages agree with the oracle") {
    // What CUDA IPC runs, over the host model: one_shot rounds announced through shared memory,
    // and messages whose headers and credits go through it, at 2 to 4 ranks.
    for (rank_t p : {2, 3, 4}) {
        CAPTURE(p);
        oracle::failures f;
        staged_runner::run(p, [&](staged_model& tp) { checks::one_shot_collectives(tp, f); }, std::chrono::milliseconds(60000));
        CHECK_MESSAGE(f.count() == 0, f.report());
    }
}

namespace {
/// Orders the steps of ranks that are threads of this process without any transport wait (a
/// wait would move messages): one rank reaches(k), another await(k) yields until it has.
struct thread_steps {
    std::atomic<int> step{0};
    void reach(int k) noexcept { step.store(k); }
    void await(int k) const noexcept {
        while (step.load() < k) std::this_thread::yield();
    }
};

/// Runs `body` on 3 ranks of shared memory (20 s timeout): what each rank's chorus::error said
/// ("" where none).
template <class Runner = shm_runner, class Body>
std::vector<std::string> shm_errors_of(Body const& body) {
    std::vector<std::string> errors(3);
    std::mutex mutex;
    try {
        Runner::run(3, [&](chorus::shm_transport& tp) {
            try {
                body(tp);
            } catch (chorus::error const& e) {
                std::lock_guard lock(mutex);
                errors[static_cast<std::size_t>(tp.rank())] = e.what();
            }
        }, std::chrono::milliseconds(20000));
    } catch (...) {
    }
    return errors;
}
} // namespace

TEST_CASE("shm: ranks that call a collective differently fail alike, whichever side of the one_shot limit they are on") {
    auto const outcome = [](std::size_t n0, std::size_t n1) {
        return shm_errors_of([&](chorus::shm_transport& tp) {
            std::vector<double> v(tp.rank() == 1 ? n1 : n0, 1.0);
            chorus::allreduce(tp, v);
        });
    };
    conformance::one_shot_mismatches(outcome, 8, 9, 100000);  // 16 KiB rounds
}

TEST_CASE("shm: a one_shot broadcast waits for the root only, and a rank that differs from the root is named by every rank") {
    // Rank 2 enters the broadcast only once the root (rank 0, then rank 1) and rank 1 each sent
    // it a message after theirs returned: a broadcast that waited for every rank would wait
    // for rank 2 until the timeout. (One round: a broadcast of several waits before each round
    // for every rank's previous one, whose slot it writes over; the matrix covers those.)
    {
        std::size_t const bytes = 3;
        std::atomic<int> done{0};
        auto const body = [&](chorus::shm_transport& tp) {
            for (rank_t root : {0, 1}) {
                std::vector<std::uint64_t> v(bytes, tp.rank() == root ? 40u + static_cast<unsigned>(root) : 0u);
                std::uint64_t token = 7;
                if (tp.rank() == 2) {
                    chorus::recv(tp, 0, std::span(&token, 1));
                    chorus::recv(tp, 1, std::span(&token, 1));
                    chorus::broadcast<chorus::one_shot>(tp, std::span(v), root);
                } else {
                    chorus::broadcast<chorus::one_shot>(tp, std::span(v), root);
                    chorus::send(tp, 2, std::span(&token, 1));
                }
                CHECK(v == std::vector<std::uint64_t>(bytes, 40u + static_cast<unsigned>(root)));
            }
            chorus::barrier<chorus::one_shot>(tp);  // a round of every rank after the rooted ones
            done.fetch_add(1);
        };
        shm_runner::run(3, body, std::chrono::milliseconds(20000));
        CHECK(done.load() == 3);
    }
    // Rank 1's size differs from the root's (rank 0, then rank 2): rank 1 compares, waits for
    // every rank's block and names itself; the others learn it at their next collective.
    for (rank_t root : {0, 2}) {
        CAPTURE(root);
        auto const errors = shm_errors_of([&](chorus::shm_transport& tp) {
            std::vector<double> v(tp.rank() == 1 ? 5 : 4, 1.0);
            chorus::broadcast(tp, std::span(v), root);
            chorus::barrier(tp);
        });
        std::string const shape = "rank 1 called broadcast with 40 bytes, root " + std::to_string(root) + ", rank 0 broadcast with 32 bytes";
        for (auto const& e : errors) {
            CHECK_MESSAGE(e.find(shape) != std::string::npos, e);
            CHECK_MESSAGE(e.find("timed out") == std::string::npos, e);
        }
    }
    // Rank 2 takes itself for the root (no rank reads its block in the broadcast: each returns),
    // then a collective of messages (the next collective checks the round: every rank names
    // rank 2); or rank 2 skips the broadcast and its messages meet the others' wait for its
    // block (every rank names the two collectives, well before the timeout).
    for (bool const skip : {false, true}) {
        CAPTURE(skip);
        auto const start = std::chrono::steady_clock::now();
        auto const errors = shm_errors_of([&](chorus::shm_transport& tp) {
            std::vector<double> v(4, 1.0), big(100000, 1.0);
            if (!skip || tp.rank() != 2) chorus::broadcast(tp, std::span(v), tp.rank() == 2 ? 2 : 0);
            chorus::allreduce(tp, std::span(big));
            chorus::barrier(tp);
        });
        std::string const what = skip ? "the ranks called different collectives"
                                      : "rank 2 called broadcast with 32 bytes, root 2, rank 0 broadcast with 32 bytes, root 0: their roots differ";
        for (auto const& e : errors) CHECK_MESSAGE(e.find(what) != std::string::npos, e);
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    }
}

TEST_CASE("shm: a receive matched to a remote message reads nothing once the group failed") {
    // Rank 1's receive matches rank 0's remote message (64 KiB, read from rank 0's memory at
    // the next progress); then rank 0 fails the group and writes over its buffer. Rank 1's
    // wait must give the failure, not the overwritten bytes as a message. (The ranks are
    // threads and order their steps with atomics: neither waits in the transport before the
    // failure, where a waiter would buffer the unmatched message.)
    thread_steps steps;
    auto const errors = shm_errors_of([&](chorus::shm_transport& tp) {
        std::vector<std::uint64_t> big(8192, 7), got(8192, 0);
        std::uint64_t token = 1;
        if (tp.rank() == 0) {
            auto receiving = tp.irecv(1, 4, std::as_writable_bytes(std::span(&token, 1)));  // so the send goes remote
            auto sent = tp.isend(1, 3, std::as_bytes(std::span(big)));
            steps.reach(1);  // the remote record is in rank 1's ring
            steps.await(2);  // rank 1 matched its receive to it
            tp.abort("rank 0 gives up");
            std::ranges::fill(big, 666);
            steps.reach(3);
            sent.wait();
        } else if (tp.rank() == 1) {
            steps.await(1);
            auto r = tp.irecv(0, 3, std::as_writable_bytes(std::span(got)));
            steps.reach(2);
            steps.await(3);
            try {
                r.wait();
            } catch (...) {
                CHECK(std::ranges::count(got, 666) == 0);
                throw;
            }
            CHECK_MESSAGE(false, "the wait returned after the group failed");
        }
    });
    CHECK_MESSAGE(errors[0].find("rank 0 gives up") != std::string::npos, errors[0]);
    CHECK_MESSAGE(errors[1].find("rank 0 gives up") != std::string::npos, errors[1]);
}

TEST_CASE("shm: waits yield at once only where the host's ranks outnumber the CPUs they may run on together") {
    // Counted over the union of the ranks' affinity masks: ranks bound one to a CPU each have a
    // core apiece (each rank's own mask holds one CPU), ranks bound to one CPU share it.
    std::size_t const cpus = allowed_cpus().size();
    if (cpus >= 2) {
        threaded_runner<bound_shm_factory<false>>::run(2, [](chorus::shm_transport& tp) { CHECK_FALSE(tp.oversubscribed()); }, 10s);
        shm_runner::run(2, [](chorus::shm_transport& tp) { CHECK_FALSE(tp.oversubscribed()); }, 10s);
    }
    threaded_runner<bound_shm_factory<true>>::run(2, [](chorus::shm_transport& tp) { CHECK(tp.oversubscribed()); }, 10s);
    if (cpus < 8)
        shm_runner::run(static_cast<rank_t>(cpus + 1), [](chorus::shm_transport& tp) { CHECK(tp.oversubscribed()); }, 10s);
}

TEST_CASE("shm: a large message is read from the sender's memory only when the sender receives too, and sends complete without their receives") {
    // shm_runner: remote reads from 32 KiB, rings of 256 KiB. A send that went through the ring
    // completes at once (it fits); a remote send only once its receiver read it. Rank 1 posts
    // nothing until rank 0 has looked (the ranks are threads, ordered by `steps`).
    thread_steps steps;
    auto const numbers_of = [](rank_t r, std::size_t n) {  // what rank r sends
        std::vector<std::uint64_t> v(n);
        std::iota(v.begin(), v.end(), std::uint64_t{100} * static_cast<std::uint64_t>(r));
        return v;
    };
    shm_runner::run(2, [&](chorus::shm_transport& tp) {
        std::vector<std::uint64_t> const big = numbers_of(tp.rank(), 8192);  // 64 KiB
        std::vector<std::uint64_t> got(8192);
        std::uint64_t token = 0;
        if (tp.rank() == 0) {
            auto alone = tp.isend(1, 1, std::as_bytes(std::span(big)));
            CHECK_MESSAGE(alone.test(), "a send from a rank that receives nothing went through the ring at once");
            auto receiving = tp.irecv(1, 2, std::as_writable_bytes(std::span(&token, 1)));
            auto read = tp.isend(1, 3, std::as_bytes(std::span(big)));
            auto const until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
            bool early = false;
            while (std::chrono::steady_clock::now() < until) early = early || read.test();
            if (tp.reads_remote(1)) CHECK_MESSAGE(!early, "a send from a rank that receives went remote: done only once read");
            else MESSAGE("process_vm_readv refused here: every message goes through the rings");
            steps.reach(1);
            read.wait();
            receiving.wait();
            CHECK(token == 9);
        } else {
            steps.await(1);
            for (chorus::tag_t tag : {chorus::tag_t{1}, chorus::tag_t{3}}) {
                chorus::recv(tp, 0, std::span(got), tag);
                CHECK(got == numbers_of(0, got.size()));
            }
            token = 9;
            chorus::send(tp, 0, std::span(&token, 1), 2);
        }
    }, std::chrono::milliseconds(20000));

    // Each rank receives something (so its sends go remote), then sends to the other before it
    // receives from it, waiting for its send or polling it with test(): each send waits for
    // the other's receive unless the progress that waits and tests make buffers a message no
    // receive matched. Without that, both wait until the timeout, or poll for ever.
    for (bool const polling : {false, true}) shm_runner::run(2, [&](chorus::shm_transport& tp) {
        rank_t const other = 1 - tp.rank();
        std::vector<std::uint64_t> const mine = numbers_of(tp.rank(), 1 << 17);  // 1 MiB
        std::vector<std::uint64_t> theirs(1 << 17);
        std::uint64_t unrelated = 0;
        auto receiving = tp.irecv(other, 5, std::as_writable_bytes(std::span(&unrelated, 1)));
        auto const start = std::chrono::steady_clock::now();
        auto sent = tp.isend(other, 6, std::as_bytes(std::span(mine)));
        if (polling) {
            bool in_time = true;
            while (in_time && !sent.test()) in_time = std::chrono::steady_clock::now() - start < std::chrono::seconds(10);
            if (!in_time) throw std::runtime_error("the send was still not done after 10 s of test()");  // fails the case
        } else {
            sent.wait();
        }
        chorus::recv(tp, other, std::span(theirs), 6);
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
        CHECK(theirs == numbers_of(other, theirs.size()));
        unrelated = 1;
        chorus::send(tp, other, std::span(&unrelated, 1), 5);
        receiving.wait();
    }, std::chrono::milliseconds(20000));
}

TEST_CASE("shm: one_shot over a round too small for one element of every block fails every rank") {
    auto const errors = shm_errors_of<shm_rounds_runner>([](chorus::shm_transport& tp) {
        std::vector<double> send(30, 1.0), recv(30);  // 3 blocks of 10: a round of 64 bytes holds 2 of each
        chorus::alltoall<chorus::one_shot>(tp, send, recv);
        std::vector<std::array<double, 4>> big(3), out(3);  // 32 bytes x 3 ranks > 64: no round holds one of each
        chorus::alltoall<chorus::one_shot>(tp, big, out);
    });
    for (auto const& e : errors) CHECK_MESSAGE(e.find("one_shot needs 96 bytes in a round, more than this transport's direct_bytes (64") != std::string::npos, e);
}

TEST_CASE("shm: without direct slots the automatic choice sends messages; empty one_shot collectives take one empty round") {
    std::atomic<int> done{0};
    shm_no_direct_runner::run(3, [&](chorus::shm_transport& tp) {
        CHECK(tp.direct_bytes() == 0);
        std::vector<int> v(2, tp.rank()), none;
        chorus::allreduce(tp, v);  // recursive doubling, not a one_shot that cannot take an element
        chorus::allreduce(tp, none);
        chorus::barrier(tp);
        std::vector<int> all(3 * 2), send(3 * 2, tp.rank()), recv(3 * 2);
        chorus::allgather(tp, v, all);
        chorus::alltoall(tp, send, recv);
        CHECK(v == std::vector<int>(2, 0 + 1 + 2));
        CHECK(recv == std::vector<int>{0, 0, 1, 1, 2, 2});
        chorus::barrier<chorus::one_shot>(tp);  // an empty round needs no slot
        done.fetch_add(1);
    }, std::chrono::milliseconds(20000));
    CHECK(done.load() == 3);
    shm_rounds_runner::run(3, [&](chorus::shm_transport& tp) {
        std::vector<std::array<double, 4>> none_in, none_out;  // no round holds one of each of 3 blocks, none is needed
        chorus::alltoall<chorus::one_shot>(tp, none_in, none_out);
        chorus::reduce_scatter<chorus::one_shot>(tp, none_in, none_out, [](auto a, auto) { return a; });
        chorus::alltoall(tp, none_in, none_out);
        done.fetch_add(1);
    }, std::chrono::milliseconds(20000));
    CHECK(done.load() == 6);
}

namespace {
/// Rank 1 of a group maps its segment with another ring (or direct slot) size than the others:
/// every rank's error lands in `errors`.
template <bool Direct>
struct shm_disagreeing_factory {
    using transport = chorus::shm_transport;
    static inline std::array<std::string, 3> errors;
    static void make(std::optional<transport>& tp, chorus::tcp_config c) {
        chorus::shm_config s;
        s.timeout = c.timeout;
        auto const r = static_cast<std::size_t>(c.rank);
        if (r == 1) (Direct ? s.direct_bytes : s.ring_bytes) = Direct ? 64 : 8192;
        chorus::tcp_transport bootstrap(std::move(c));
        try {
            tp.emplace(bootstrap, s);
        } catch (chorus::error const& e) {
            errors[r] = e.what();
            // As shm_transport::from_env does with an error every rank throws: leave the
            // bootstrap with a goodbye, so that ranks still in the verdicts' exchange finish it.
            { chorus::tcp_transport const leaving = std::move(bootstrap); }
            throw;
        }
    }
};
} // namespace

TEST_CASE("shm: collectives on registered shm_buffers read the peers' buffers where they lie and agree with the oracle") {
    static_assert(chorus::registering_transport<chorus::shm_transport>);
    static_assert(chorus::putting_transport<chorus::shm_transport>);
    for (rank_t p : {1, 2, 3, 4, 5, 7}) {
        CAPTURE(p);
        auto const up = static_cast<std::size_t>(p);
        shm_runner::run(p, [&](chorus::shm_transport& tp) {
            CHECK_FALSE(tp.exposes());
            // 0, 1, p - 1, p + 1 elements: below the 16 KiB slot (one_shot); 5003: above it.
            for (std::size_t n : {std::size_t{0}, std::size_t{1}, up - 1, up + 1, std::size_t{5003}}) {
                registered_check::run<double>(tp, n);
                registered_check::run<std::int32_t>(tp, n);
            }
        }, 60s);
    }
}

TEST_CASE("shm: memory outside a registered shm_buffer is never read where it lies: the collectives send messages, on every rank alike") {
    shm_runner::run(3, [&](chorus::shm_transport& tp) {
        auto const me = static_cast<std::size_t>(tp.rank());
        std::size_t const n = 6000;  // 48 KB of doubles: above the slot
        auto const check_sum = [&](std::span<double const> v, double k) {
            for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == 3.0 + 3.0 * (k + static_cast<double>(i % 5)));
        };
        auto const fill = [&](std::span<double> v, double k) {
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(me) + k + static_cast<double>(i % 5);
        };
        std::vector<double> plain(n);
        fill(plain, 0);
        chorus::allreduce(tp, plain);  // nothing registered: no exposed round at all
        check_sum(plain, 0);
        CHECK(tp.exposed_rounds() == 0);
        // Empty buffers register (nothing to map), but give the choices nothing to read.
        auto const nothing = chorus::register_buffer(tp, std::span<double>());
        CHECK(nothing.kept());
        CHECK_FALSE(tp.exposes());
        chorus::deregister_buffer(tp, nothing);
        // Ordinary memory cannot be registered; one rank's alone fails the registration everywhere.
        auto const refused = chorus::register_buffer(tp, plain);
        CHECK_FALSE(refused.kept());
        chorus::shm_buffer memory(2 * n * sizeof(double));
        std::span<double> const first = memory.as<double>().first(n), second = memory.as<double>().last(n);
        auto const lonely = chorus::register_buffer(tp, me == 1 ? std::span<double>(plain) : first);
        CHECK_FALSE(lonely.kept());
        CHECK_FALSE(tp.exposes());
        chorus::deregister_buffer(tp, refused);
        chorus::deregister_buffer(tp, lonely);
        auto const reg = chorus::register_buffer(tp, first);
        REQUIRE(reg.kept());
        CHECK(tp.exposes());
        // Outside the registration (plain memory; the shm_buffer's unregistered half; one rank's
        // buffer registered and the others' not): every rank falls back, the results stay right.
        std::uint64_t const before = tp.exposed_rounds();
        fill(plain, 1);
        chorus::allreduce(tp, plain);
        check_sum(plain, 1);
        fill(second, 2);
        chorus::allreduce<chorus::two_shot>(tp, second);
        check_sum(second, 2);
        std::span<double> const mixed = me == 0 ? first : second;
        fill(mixed, 3);
        chorus::allreduce(tp, mixed);
        check_sum(mixed, 3);
        std::vector<double> gathered(3 * n);
        chorus::allgather<chorus::zero_copy>(tp, std::span<double const>(plain), gathered);
        for (std::size_t x = 0; x < gathered.size(); ++x) REQUIRE(gathered[x] == plain[x % n]);
        CHECK(tp.exposed_rounds() == before);
        fill(first, 4);
        chorus::allreduce(tp, first);  // inside it: read where it lies
        check_sum(first, 4);
        CHECK(tp.exposed_rounds() == before + 2);
        // A broadcast needs the root's buffer registered only: the others read it where it lies
        // whatever their memory, and the root writes its share into those registered (rank 2's
        // here, not rank 1's, which copies it all).
        std::span<double> const target = me == 1 ? second : first;
        for (std::size_t i = 0; i < n; ++i) target[i] = me == 0 ? 7.0 + static_cast<double>(i % 11) : -1.0;
        chorus::broadcast(tp, target, 0);
        for (std::size_t i = 0; i < n; ++i) REQUIRE(target[i] == 7.0 + static_cast<double>(i % 11));
        CHECK(tp.exposed_rounds() == before + 3);
        // Every rank's output registered but the root's: the round falls back, to messages.
        std::span<double> const unshared = me == 2 ? second : first;
        for (std::size_t i = 0; i < n; ++i) unshared[i] = me == 2 ? 9.0 + static_cast<double>(i % 5) : -1.0;
        chorus::broadcast<chorus::zero_copy>(tp, unshared, 2);
        for (std::size_t i = 0; i < n; ++i) REQUIRE(unshared[i] == 9.0 + static_cast<double>(i % 5));
        CHECK(tp.exposed_rounds() == before + 3);
        // Elements of 12 bytes, from rank 1: the root's share starts inside an element.
        struct triple {
            float x, y, z;
        };
        std::span<triple> const triples = memory.as<triple>().first(n * sizeof(double) / sizeof(triple));
        for (std::size_t i = 0; i < triples.size(); ++i) {
            auto const f = static_cast<float>(i);
            triples[i] = me == 1 ? triple{f, 2 * f, 3 * f} : triple{-1, -1, -1};
        }
        chorus::broadcast(tp, triples, 1);
        for (std::size_t i = 0; i < triples.size(); ++i) {
            auto const f = static_cast<float>(i);
            REQUIRE((triples[i].x == f && triples[i].y == 2 * f && triples[i].z == 3 * f));
        }
        CHECK(tp.exposed_rounds() == before + 4);
        chorus::deregister_buffer(tp, reg);
        CHECK_FALSE(tp.exposes());
        fill(first, 5);
        chorus::allreduce(tp, first);
        check_sum(first, 5);
        CHECK(tp.exposed_rounds() == before + 4);
    }, 30s);
}

TEST_CASE("shm: ranks that read a registered buffer where it lies while a peer publishes a copy of it fail alike, before any read") {
    // Rank 0 runs one_shot, the others zero_copy, on the same registered 8-element block: the
    // same collective, shape and round, but a record of the buffer is no copy of it.
    auto const errors = shm_errors_of([](chorus::shm_transport& tp) {
        chorus::shm_buffer memory(4 * 8 * sizeof(int));
        std::span<int> const all = memory.as<int>();
        auto const reg = chorus::register_buffer(tp, all);
        REQUIRE(reg.kept());
        std::span<int const> const block = all.first(8);
        std::span<int> const gathered = all.subspan(8, 24);
        if (tp.rank() == 0) chorus::allgather<chorus::one_shot>(tp, block, gathered);
        else chorus::allgather<chorus::zero_copy>(tp, block, gathered);
    });
    for (auto const& e : errors) {
        CHECK_MESSAGE(e.find("the ranks run different algorithms of it") != std::string::npos, e);
        CHECK_MESSAGE((e.find("published a copy") != std::string::npos || e.find("exposed its buffer") != std::string::npos), e);
    }
}

TEST_CASE("shm: an exposed round shows each peer's registered buffer, or its part for this rank, where it lies") {
    shm_runner::run(3, [&](chorus::shm_transport& tp) {
        auto const me = tp.rank();
        std::size_t const bytes = 100000 + 1000 * static_cast<std::size_t>(me);  // each above the 16 KiB slot, each its own size
        chorus::shm_buffer memory(bytes);
        auto const mine = memory.bytes();
        for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(me)) & 0xff);
        auto const reg = chorus::register_buffer(tp, mine);
        REQUIRE(reg.kept());
        chorus::tag_t const tag = chorus::collective_tag_bit | 77;
        REQUIRE(tp.expose(mine, 5, tag));
        for (rank_t r = 0; r < 3; ++r) {
            auto const theirs = tp.block(r);
            std::size_t const size = 100000 + 1000 * static_cast<std::size_t>(r);
            REQUIRE(theirs.size() == size);
            CHECK(tp.agreed(r) == 5);
            CHECK((r == me) == (theirs.data() == mine.data()));
            for (std::size_t i = 0; i < size; ++i) REQUIRE(theirs[i] == static_cast<std::byte>((i * 7 + static_cast<std::size_t>(r)) & 0xff));
        }
        tp.exchange({}, 6, tag);  // the closing round: the views end
        CHECK(tp.block(me).empty());
        CHECK(tp.exposable(mine.first(10)));
        CHECK_FALSE(tp.exposable(std::span<std::byte const>(mine.data(), bytes + 100)));
        // In parts: rank r reads the r-th third's first r + 1 bytes of this rank's buffer (inside the registration).
        std::array<std::span<std::byte const>, 3> parts;
        for (std::size_t r = 0; r < 3; ++r) parts[r] = std::span<std::byte const>(mine).subspan(r * (bytes / 3), r + 1);
        REQUIRE(tp.expose(mine, parts, 7, tag));
        for (rank_t r = 0; r < 3; ++r) {
            auto const part = tp.block(r);
            REQUIRE(part.size() == static_cast<std::size_t>(me) + 1);
            std::size_t const from = static_cast<std::size_t>(me) * ((100000 + 1000 * static_cast<std::size_t>(r)) / 3);
            for (std::size_t i = 0; i < part.size(); ++i)
                CHECK(part[i] == static_cast<std::byte>(((from + i) * 7 + static_cast<std::size_t>(r)) & 0xff));
        }
        tp.exchange({}, 8, tag);
        // A range past the registration's end (in the allocation's last page) is not exposed, on
        // any rank, though the others' are inside theirs.
        CHECK_FALSE(tp.expose(me == 2 ? std::span<std::byte const>(mine.data(), bytes + 100) : std::span<std::byte const>(mine).first(10), 9, tag));
        for (rank_t r = 0; r < 3; ++r) CHECK(tp.put_block(r).empty());  // nothing to write after a fall-back
        tp.exchange({}, 10, tag);
        // A buffer no peer reads (every peer's part empty) needs no registration: ordinary memory.
        std::vector<std::byte> own(64);
        std::array<std::span<std::byte const>, 3> only_mine{};
        only_mine[static_cast<std::size_t>(me)] = std::span<std::byte const>(own).first(8);
        CHECK(tp.expose(own, only_mine, 11, tag));
        for (rank_t r = 0; r < 3; ++r) CHECK(tp.block(r).size() == (r == me ? 8u : 0u));
        tp.exchange({}, 12, tag);
        chorus::deregister_buffer(tp, reg);
        CHECK_FALSE(tp.exposes());
        // Two registrations of one allocation (they share the peers' mapping): ending the first
        // leaves the second whole.
        auto const half = chorus::register_buffer(tp, mine.first(bytes / 2));
        auto const whole = chorus::register_buffer(tp, mine);
        chorus::deregister_buffer(tp, half);
        CHECK(tp.exposes());
        REQUIRE(tp.expose(mine, 13, tag));
        for (rank_t r = 0; r < 3; ++r) {
            auto const theirs = tp.block(r);
            std::size_t const size = 100000 + 1000 * static_cast<std::size_t>(r);
            REQUIRE(theirs.size() == size);
            for (std::size_t i = 0; i < size; i += 997) REQUIRE(theirs[i] == static_cast<std::byte>((i * 7 + static_cast<std::size_t>(r)) & 0xff));
        }
        // putting_transport: each peer's block, writable where it lies (this rank's own is not
        // offered). Each rank writes its mark at byte 50000 + its rank of every peer's buffer,
        // bytes no rank reads in this round.
        for (rank_t r = 0; r < 3; ++r) {
            auto const into = tp.put_block(r);
            if (r == me) {
                CHECK(into.empty());
                continue;
            }
            REQUIRE(into.data() == tp.block(r).data());
            REQUIRE(into.size() == tp.block(r).size());
            into[50000 + static_cast<std::size_t>(me)] = static_cast<std::byte>(0xa0 + me);
        }
        tp.exchange({}, 14, tag);  // the closing round: the writes are seen, the views end
        CHECK(tp.put_block(me == 0 ? 1 : 0).empty());
        for (rank_t r = 0; r < 3; ++r) {
            auto const at = 50000 + static_cast<std::size_t>(r);
            CHECK(mine[at] == (r == me ? static_cast<std::byte>((at * 7 + static_cast<std::size_t>(me)) & 0xff) : static_cast<std::byte>(0xa0 + r)));
        }
        chorus::deregister_buffer(tp, whole);
        CHECK_FALSE(tp.exposes());
    }, 30s);
}

TEST_CASE("shm: ranks that map segments of different ring or slot sizes fail to join, every one naming the setting") {
    // Rank 0 compares every rank's hello with its own and hands its verdict to all: the same words everywhere.
    auto const check = [&]<bool Direct>(std::string const& want) {
        CHECK_THROWS(threaded_runner<shm_disagreeing_factory<Direct>>::run(3, [](chorus::shm_transport&) {}, 20s));
        for (auto const& e : shm_disagreeing_factory<Direct>::errors) CHECK_MESSAGE(e.find(want) != std::string::npos, e);
    };
    check.template operator()<true>("rank 1 has direct_bytes 64, rank 0 16384 (CHORUS_SHM_DIRECT_BYTES must agree)");
    check.template operator()<false>("rank 1 has ring_bytes 8192, rank 0 262144 (CHORUS_SHM_RING_BYTES must agree)");
}
