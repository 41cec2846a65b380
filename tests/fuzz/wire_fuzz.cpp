// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
//
// libFuzzer target for what a TCP rank decodes from bytes a peer chose: the frame stream (the
// engine, reading a connection whose bytes are the input) and the handshake (challenge, hello,
// mesh handshake and rendezvous table). The first input byte picks which; the rest is the data.
//
//   clang++ -fsanitize=fuzzer,address,undefined (CMake: -DCHORUS_BUILD_FUZZ=ON with clang)
//   build-fuzz/tests/fuzz/wire_fuzz -max_total_time=60 tests/fuzz/corpus
//
// Whatever the bytes, a rank must end in a result or a chorus::error, never a crash, a hang or
// an allocation the bytes decided (CHORUS_MAX_MESSAGE_BYTES and flow control bound it here to
// 4 KiB and 256 bytes).

#include <chorus/transport/tcp.hpp>
#include <chorus/transport/tcp/engine.hpp>
#include <chorus/transport/tcp/wire.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

namespace {

namespace w = chorus::detail::tcp_wire;

// Rank 0 of two; rank 1's end of the connection writes `bytes`, then closes. Rank 0 waits for
// one message of 64 bytes, tag 7.
void frame_stream(std::span<std::uint8_t const> bytes) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return;
    std::size_t off = 0;
    while (off < bytes.size()) {
        ssize_t const n = ::write(fds[1], bytes.data() + off, bytes.size() - off);
        if (n <= 0) break;
        off += static_cast<std::size_t>(n);
    }
    ::close(fds[1]);  // what was written stays readable, then the end of the stream

    chorus::tcp_config cfg;
    cfg.rank = 0;
    cfg.size = 2;
    cfg.timeout = std::chrono::milliseconds(2000);
    cfg.heartbeat = std::chrono::milliseconds(0);
    cfg.spin = std::chrono::microseconds(0);
    cfg.max_message_bytes = 4096;
    cfg.max_unexpected_bytes = 256;
    auto io = std::make_unique<asio::io_context>();
    std::vector<std::unique_ptr<asio::ip::tcp::socket>> sockets(2);
    sockets[1] = std::make_unique<asio::ip::tcp::socket>(*io);
    asio::error_code ec;
    sockets[1]->assign(asio::ip::tcp::v4(), fds[0], ec);
    if (ec) {
        ::close(fds[0]);
        return;
    }
    std::array<std::byte, 64> buffer{};
    try {
        chorus::detail::tcp_socket_engine engine(cfg, std::move(io), std::move(sockets));
        auto op = engine.irecv(1, 7, buffer);
        engine.wait(op);
        auto second = engine.irecv(1, 8, std::span(buffer).first(16));  // what came after it
        engine.wait(second);
    } catch (chorus::error const&) {  // the expected end of most inputs
    }
}

void handshake(std::span<std::uint8_t const> bytes) {
    if (bytes.size() >= w::challenge_size) (void)w::decode_challenge(bytes.data());
    if (bytes.size() >= w::hello_head_size) {
        auto const h = w::decode_hello(bytes.data());
        if (h.addr_len <= w::max_addr && bytes.size() >= w::hello_head_size + w::mac_size + h.addr_len) {
            std::string const addr(reinterpret_cast<char const*>(bytes.data()) + w::hello_head_size + w::mac_size,
                                   static_cast<std::size_t>(h.addr_len));
            auto const mac = w::hello_mac("token", w::nonce{}, bytes.first(w::hello_head_size), addr);
            (void)chorus::detail::equal_in_constant_time(mac, bytes.subspan(w::hello_head_size, w::mac_size));
        }
    }
    if (bytes.size() >= w::mesh_head_size) {
        auto const m = w::decode_mesh(bytes.data());
        (void)chorus::detail::equal_in_constant_time(w::mesh_mac("token", w::nonce{}, bytes.first(16)), m.proof);
    }
    if (!bytes.empty()) {  // a table of 1..64 entries, its body the rest
        std::vector<unsigned char> const body(bytes.begin() + 1, bytes.end());
        if (auto const entries = w::decode_table(body, std::size_t{bytes[0]} % 64 + 1))
            for (auto const& e : *entries) (void)e.addr.size();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
    if (size == 0) return 0;
    std::span<std::uint8_t const> const rest(data + 1, size - 1);
    if (data[0] % 2 == 0) frame_stream(rest);
    else handshake(rest);
    return 0;
}
