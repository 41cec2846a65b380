// SPDX-License-Identifier: MIT
// two_way_bench: the loopback TCP ceiling that a collective of two ranks on one host meets.
//
// Usage: two_way_bench [MiB ...]        (default 16 64)
//
// The peers' tcp_bench measures one stream, one way: a sender's copies into the socket and the
// receiver's copies out, each on a core of its own. A 2-rank allreduce, allgather or alltoall
// sends and receives at once on both ranks, so on a host of two cores each core makes both
// copies of every byte. This prints, for one connection between two processes (congestion
// control Reno and 4 MiB socket buffers, as tcp_transport sets them on one host), the median of
// 15 rounds of MiB bytes one way, then MiB bytes each way at the same time (each process sends
// in a second thread while its main thread receives):
//
//   two_way <MiB> MiB: one way <ms> ms (<GB/s>); each way at once <ms> ms (<GB/s> per direction)
//
// For two ranks the nccl-tests busbw of allreduce, allgather and alltoall is what one rank
// moves each way per second, so "per direction" is the figure their busbw compares with.
// Plain POSIX sockets, nothing of chorus: a ceiling, not a measurement of the library.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(bool ok, char const* what) {
    if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

void configure(int s) {
    int one = 1, buffer = 4 << 20;
    check(::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
    check(::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer) == 0, "SO_SNDBUF");
    check(::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer) == 0, "SO_RCVBUF");
    check(::setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, "reno", 4) == 0, "TCP_CONGESTION reno");
}

void send_all(int s, char const* p, std::size_t n) {
    while (n > 0) {
        ssize_t const k = ::send(s, p, n, MSG_NOSIGNAL);
        check(k > 0, "send");
        p += k;
        n -= static_cast<std::size_t>(k);
    }
}

void recv_all(int s, char* p, std::size_t n) {
    while (n > 0) {
        ssize_t const k = ::recv(s, p, n, 0);
        check(k > 0, "recv");
        p += k;
        n -= static_cast<std::size_t>(k);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// One side of the connection; `first` (the child) speaks first in every handshake byte.
void measure(int s, bool first, std::size_t bytes) {
    constexpr int rounds = 15;
    std::vector<char> out(bytes, '\1'), in(bytes, '\0');
    char token = 0;
    // Both sides here before either starts: one byte there and back.
    auto const meet = [&] {
        if (first) {
            send_all(s, &token, 1);
            recv_all(s, &token, 1);
        } else {
            recv_all(s, &token, 1);
            send_all(s, &token, 1);
        }
    };
    using clock = std::chrono::steady_clock;
    std::vector<double> one_way, two_way;
    for (int r = 0; r < rounds; ++r) {
        meet();
        auto t0 = clock::now();
        if (first) send_all(s, out.data(), bytes);
        else recv_all(s, in.data(), bytes);
        meet();  // ends when the last byte arrived (a round trip of 1 byte more: ~15 us)
        one_way.push_back(std::chrono::duration<double>(clock::now() - t0).count());
        meet();
        t0 = clock::now();
        std::thread sender([&] { send_all(s, out.data(), bytes); });
        recv_all(s, in.data(), bytes);
        sender.join();
        meet();
        two_way.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    if (first) return;
    double const t1 = median(one_way), t2 = median(two_way), b = static_cast<double>(bytes);
    std::printf("two_way %zu MiB: one way %.2f ms (%.2f GB/s); each way at once %.2f ms (%.2f GB/s per direction)\n",
                bytes >> 20, t1 * 1e3, b / t1 / 1e9, t2 * 1e3, b / t2 / 1e9);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
    std::vector<std::size_t> mib;
    for (int i = 1; i < argc; ++i) mib.push_back(std::strtoul(argv[i], nullptr, 10));
    if (mib.empty()) mib = {16, 64};
    int const listener = ::socket(AF_INET, SOCK_STREAM, 0);
    check(listener >= 0, "socket");
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof at;
    check(::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0, "bind");
    check(::listen(listener, 1) == 0 && ::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len) == 0, "listen");
    pid_t const child = ::fork();
    check(child >= 0, "fork");
    int s = -1;
    if (child == 0) {
        s = ::socket(AF_INET, SOCK_STREAM, 0);
        check(s >= 0, "socket");
        configure(s);  // before connecting: the buffers size the window
        check(::connect(s, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0, "connect");
    } else {
        configure(listener);  // before the handshake, which the accepted socket's buffers size
        s = ::accept(listener, nullptr, nullptr);
        check(s >= 0, "accept");
        configure(s);  // and again on it, not relying on what accept() inherits
    }
    for (std::size_t m : mib)
        if (m > 0) measure(s, child == 0, m << 20);
    ::close(s);
    if (child != 0) {
        int status = 0;
        ::waitpid(child, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    return 0;
} catch (std::exception const& e) {
    std::fprintf(stderr, "two_way_bench: %s\n", e.what());
    return 1;
}
