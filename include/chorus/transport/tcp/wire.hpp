// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The bytes tcp_transport puts on the wire, all integers little-endian u64:
//
//   challenge (whoever accepts a connection, at once): {challenge_magic} nonce[16]
//   hello (rank -> master):  {hello_magic, rank, size, port, address length} mac[32] address
//                            (the address and port this rank listens on)
//   table (master -> rank):  {length} then for every rank {port, address length} address;
//                            or, when the master refuses the rank or its rendezvous failed,
//                            {refusal, errc, rank to blame, text length} text
//   mesh (rank -> lower rank): {mesh_magic, rank} mac[32]; answered by one byte, accepted
//                            (lower -> higher rank); then, once a rank holds all its
//                            connections, one byte ready on each (both ways); or, from a
//                            rank whose rendezvous failed, one byte failed
//   frame (after the mesh):  {type, tag, size} then `size` payload bytes; types: data, abort
//                            (payload: the reason; tag: the rank it blames, + 1; 0: the
//                            sender), goodbye (size 0: "I am leaving the group"),
//                            heartbeat (size 0: "I am alive", from the heartbeat thread)
//
// The magics make a connection from anything that is not a chorus rank of this version fail
// its handshake at once (it is refused, the job goes on). The job token never crosses the wire:
// a mac is HMAC-SHA256(token, what it proves, the challenge's nonce, the handshake's other
// bytes), so it shows the token is known without revealing it, holds for this connection only
// (a captured handshake cannot be replayed) and binds the rank, size and address it came with.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <chorus/detail/sha256.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail::tcp_wire {

inline constexpr std::uint64_t hello_magic = 0x33305355524f4843ULL;      // "CHORUS03"
inline constexpr std::uint64_t mesh_magic = 0x33304853454d4843ULL;       // "CHMESH03"
inline constexpr std::uint64_t challenge_magic = 0x33304c4148434843ULL;  // "CHCHAL03"
inline constexpr unsigned char mesh_accepted = 0xac, mesh_ready = 0x5e, mesh_failed = 0xfa;
inline constexpr std::uint64_t frame_data = 1, frame_abort = 2, frame_goodbye = 3, frame_heartbeat = 4;
inline constexpr std::size_t header_size = 24, hello_head_size = 40, mac_size = 32;
inline constexpr std::size_t mesh_head_size = 16 + mac_size;  // the mac is part of it
inline constexpr std::size_t nonce_size = 16, challenge_size = 8 + nonce_size;
inline constexpr std::size_t max_token = 4096, max_addr = 256;
inline constexpr std::uint64_t max_table = std::uint64_t{1} << 24;
inline constexpr std::uint64_t refusal = ~std::uint64_t{0};  // in place of a table's length
inline constexpr std::size_t refusal_head_size = 24, max_refusal_text = 4096;

inline void put64(unsigned char* p, std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get64(unsigned char const* p) noexcept {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
    return v;
}
inline void append64(std::vector<unsigned char>& out, std::uint64_t v) {
    unsigned char b[8];
    put64(b, v);
    out.insert(out.end(), b, b + 8);
}
inline void append(std::vector<unsigned char>& out, std::string const& s) { out.insert(out.end(), s.begin(), s.end()); }

struct frame_header {
    std::uint64_t type = frame_data;
    tag_t tag = 0;
    std::uint64_t size = 0;
};
inline void encode(unsigned char* out, frame_header const& h) noexcept {
    put64(out, h.type);
    put64(out + 8, h.tag);
    put64(out + 16, h.size);
}
inline frame_header decode_frame(unsigned char const* in) noexcept { return {get64(in), get64(in + 8), get64(in + 16)}; }

using nonce = std::array<unsigned char, nonce_size>;
using mac = std::array<unsigned char, mac_size>;

/// A fresh challenge: its bytes, to send, and its nonce, to check the answer against.
struct challenge {
    std::array<unsigned char, challenge_size> bytes{};
    nonce value{};
};
inline challenge make_challenge() {
    challenge c;
    std::random_device random;  // the kernel's random source
    for (std::size_t i = 0; i < nonce_size; i += 4) {
        unsigned const r = random();
        for (std::size_t j = 0; j < 4; ++j) c.value[i + j] = static_cast<unsigned char>(r >> (8 * j));
    }
    put64(c.bytes.data(), challenge_magic);
    std::copy(c.value.begin(), c.value.end(), c.bytes.begin() + 8);
    return c;
}
/// The nonce of a challenge received, or nothing if it is not one.
inline std::optional<nonce> decode_challenge(unsigned char const* in) noexcept {
    if (get64(in) != challenge_magic) return std::nullopt;
    nonce n{};
    std::copy(in + 8, in + challenge_size, n.begin());
    return n;
}

/// A hello's fixed part; the mac and the address follow it.
struct hello_head {
    std::uint64_t magic, rank, size, port, addr_len;
};
inline hello_head decode_hello(unsigned char const* h) noexcept {
    return {get64(h), get64(h + 8), get64(h + 16), get64(h + 24), get64(h + 32)};
}
/// The mac of a hello whose fixed part is `head` (hello_head_size bytes) and address `addr`.
inline mac hello_mac(std::string const& token, nonce const& n, std::span<unsigned char const> head, std::string_view addr) {
    return hmac_sha256(token, std::string_view("chorus hello"), n, head, addr);
}
inline std::vector<unsigned char> encode_hello(rank_t rank, rank_t size, std::uint16_t port, std::string const& token,
                                               std::string const& addr, nonce const& n) {
    std::vector<unsigned char> out;
    for (std::uint64_t v : {hello_magic, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(size),
                            std::uint64_t{port}, std::uint64_t{addr.size()}})
        append64(out, v);
    mac const m = hello_mac(token, n, out, addr);
    out.insert(out.end(), m.begin(), m.end());
    append(out, addr);
    return out;
}

/// A mesh handshake: its rank, and the mac of its first 16 bytes.
struct mesh_head {
    std::uint64_t magic, rank;
    mac proof;
};
inline mesh_head decode_mesh(unsigned char const* h) noexcept {
    mesh_head m{get64(h), get64(h + 8), {}};
    std::copy(h + 16, h + mesh_head_size, m.proof.begin());
    return m;
}
inline mac mesh_mac(std::string const& token, nonce const& n, std::span<unsigned char const> head16) {
    return hmac_sha256(token, std::string_view("chorus mesh"), n, head16);
}
inline std::vector<unsigned char> encode_mesh(rank_t rank, std::string const& token, nonce const& n) {
    std::vector<unsigned char> out;
    for (std::uint64_t v : {mesh_magic, static_cast<std::uint64_t>(rank)}) append64(out, v);
    mac const m = mesh_mac(token, n, out);
    out.insert(out.end(), m.begin(), m.end());
    return out;
}

/// What the master sends a rank instead of the table: why it will not get one.
inline std::vector<unsigned char> encode_refusal(std::uint64_t code, rank_t blame, std::string const& why) {
    std::vector<unsigned char> out;
    std::string const text = why.substr(0, max_refusal_text);
    for (std::uint64_t v : {refusal, code, static_cast<std::uint64_t>(static_cast<std::int64_t>(blame)), std::uint64_t{text.size()}})
        append64(out, v);
    append(out, text);
    return out;
}

/// Where a rank listens, as the table says.
struct table_entry {
    std::string addr;
    std::uint16_t port = 0;
};
/// The table with its length in front, ready to send.
inline std::vector<unsigned char> encode_table(std::vector<table_entry> const& entries) {
    std::vector<unsigned char> blob;
    for (auto const& e : entries) {
        append64(blob, e.port);
        append64(blob, e.addr.size());
        append(blob, e.addr);
    }
    std::vector<unsigned char> out;
    append64(out, blob.size());
    out.insert(out.end(), blob.begin(), blob.end());
    return out;
}
/// The `n` entries of a table's body (without its length), or nothing if it is malformed.
inline std::optional<std::vector<table_entry>> decode_table(std::vector<unsigned char> const& in, std::size_t n) {
    std::vector<table_entry> entries(n);
    std::size_t off = 0;
    for (auto& e : entries) {
        if (off + 16 > in.size()) return std::nullopt;
        std::uint64_t const port = get64(in.data() + off);
        auto const len = static_cast<std::size_t>(get64(in.data() + off + 8));
        off += 16;
        if (len > in.size() - off || port > 65535) return std::nullopt;
        e.addr.assign(reinterpret_cast<char const*>(in.data() + off), len);
        e.port = static_cast<std::uint16_t>(port);
        off += len;
    }
    return entries;
}

} // namespace chorus::detail::tcp_wire
