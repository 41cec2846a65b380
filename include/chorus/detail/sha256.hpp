// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous's challenge-response:
// a rank proves it holds the job token by the HMAC of a fresh challenge, so the token never
// crosses the wire and a captured handshake cannot be replayed. A few hundred bytes per
// connection, once: written here rather than depending on a crypto library for it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace chorus::detail {

class sha256 {
public:
    using digest = std::array<unsigned char, 32>;

    sha256& update(std::span<unsigned char const> bytes) noexcept {
        for (unsigned char b : bytes) {
            block_[fill_++] = b;
            if (fill_ == 64) {
                compress();
                fill_ = 0;
            }
        }
        length_ += bytes.size();
        return *this;
    }
    sha256& update(std::string_view s) noexcept {
        return update({reinterpret_cast<unsigned char const*>(s.data()), s.size()});
    }

    digest finish() noexcept {
        std::uint64_t const bits = length_ * 8;
        unsigned char const pad = 0x80;
        update({&pad, 1});
        unsigned char const zero = 0;
        while (fill_ != 56) update({&zero, 1});
        unsigned char len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
        update({len, 8});
        digest out{};
        for (std::size_t i = 0; i < 8; ++i)
            for (std::size_t j = 0; j < 4; ++j) out[4 * i + j] = static_cast<unsigned char>(h_[i] >> (24 - 8 * j));
        return out;
    }

private:
    static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

    void compress() noexcept {
        static constexpr std::uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        std::uint32_t w[64];
        for (std::size_t i = 0; i < 16; ++i)
            w[i] = std::uint32_t{block_[4 * i]} << 24 | std::uint32_t{block_[4 * i + 1]} << 16 |
                   std::uint32_t{block_[4 * i + 2]} << 8 | std::uint32_t{block_[4 * i + 3]};
        for (std::size_t i = 16; i < 64; ++i) {
            std::uint32_t const s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            std::uint32_t const s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
        for (std::size_t i = 0; i < 64; ++i) {
            std::uint32_t const t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            std::uint32_t const t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        h_[0] += a;
        h_[1] += b;
        h_[2] += c;
        h_[3] += d;
        h_[4] += e;
        h_[5] += f;
        h_[6] += g;
        h_[7] += h;
    }

    std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char block_[64]{};
    std::size_t fill_ = 0;
    std::uint64_t length_ = 0;  // bytes
};

/// HMAC-SHA256 of the concatenated `parts` under `key`.
template <class... Parts>
sha256::digest hmac_sha256(std::string_view key, Parts const&... parts) noexcept {
    std::array<unsigned char, 64> k{};
    if (key.size() > k.size()) {
        auto const d = sha256().update(key).finish();
        for (std::size_t i = 0; i < d.size(); ++i) k[i] = d[i];
    } else {
        for (std::size_t i = 0; i < key.size(); ++i) k[i] = static_cast<unsigned char>(key[i]);
    }
    std::array<unsigned char, 64> pad{};
    for (std::size_t i = 0; i < 64; ++i) pad[i] = static_cast<unsigned char>(k[i] ^ 0x36);
    sha256 inner;
    inner.update(pad);
    (inner.update(parts), ...);
    auto const inner_digest = inner.finish();
    for (std::size_t i = 0; i < 64; ++i) pad[i] = static_cast<unsigned char>(k[i] ^ 0x5c);
    return sha256().update(pad).update(inner_digest).finish();
}

/// Equality that takes as long whatever the bytes (a MAC's check must not tell how much of it
/// was right).
inline bool equal_in_constant_time(std::span<unsigned char const> a, std::span<unsigned char const> b) noexcept {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) diff = static_cast<unsigned char>(diff | (a[i] ^ b[i]));
    return diff == 0;
}

} // namespace chorus::detail
