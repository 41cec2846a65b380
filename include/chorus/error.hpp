// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

#include <string>
#include <system_error>

#include <chorus/fwd.hpp>

namespace chorus {

/// Why a chorus operation failed. The values are stable; they travel in error_code.
enum class errc {
    invalid_argument = 1,  ///< bad rank, root, count or buffer size given by the caller
    timeout,               ///< a wait exceeded the transport's timeout
    size_mismatch,         ///< a message's size differs from what the receiver posted
    tag_mismatch,          ///< the peer is in a different collective than this rank
    peer_failed,           ///< another rank failed or left; the group is broken
    connection_failed,     ///< the transport could not reach a peer
    aborted,               ///< this rank's group was aborted earlier
    device_error,          ///< the device runtime (CUDA) failed; the message has its error string
};

namespace detail {
class error_category_impl final : public std::error_category {
public:
    char const* name() const noexcept override { return "chorus"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::invalid_argument: return "invalid argument";
        case errc::timeout: return "timed out";
        case errc::size_mismatch: return "message size mismatch";
        case errc::tag_mismatch: return "collective mismatch";
        case errc::peer_failed: return "peer failed";
        case errc::connection_failed: return "connection failed";
        case errc::aborted: return "aborted";
        case errc::device_error: return "device error";
        }
        return "unknown chorus error";
    }
};
} // namespace detail

/// The category of chorus error codes; a function-local static keeps it header-only.
inline std::error_category const& error_category() noexcept {
    static detail::error_category_impl const category;
    return category;
}

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

/// Base of every exception chorus throws. `code()` says which `errc`.
class error : public std::system_error {
public:
    error(errc e, std::string const& what) : std::system_error(make_error_code(e), what) {}
};

/// The caller passed something invalid (rank, root, counts, buffer sizes).
class invalid_argument : public error {
public:
    explicit invalid_argument(std::string const& what) : error(errc::invalid_argument, what) {}
};

/// Communication with a peer failed; `peer()` names it (-1 when no single peer is to blame).
class transport_error : public error {
public:
    transport_error(errc e, rank_t peer, std::string const& what) : error(e, what), peer_(peer) {}
    rank_t peer() const noexcept { return peer_; }

private:
    rank_t peer_;
};

/// A wait ran past the transport's timeout; `peer()` is the rank that was waited for.
class timeout_error : public transport_error {
public:
    timeout_error(rank_t peer, std::string const& what) : transport_error(errc::timeout, peer, what) {}
};

/// The device runtime failed (a CUDA call returned an error); what() names the call and
/// carries the runtime's error string.
class device_error : public error {
public:
    explicit device_error(std::string const& what) : error(errc::device_error, what) {}
};

namespace detail {
/// Marks an error every rank of a group agreed on and throws (a set-up verdict exchanged
/// before anyone threw): a bootstrap group may then be left with a goodbye, not aborted, so that
/// a rank still finishing that exchange gets its last messages and throws the error itself
/// rather than "rank N left the group". Caught as `E`.
struct agreed_failure {};
template <class E>
class agreed final : public E, public agreed_failure {
public:
    using E::E;
};
} // namespace detail

} // namespace chorus

template <>
struct std::is_error_code_enum<chorus::errc> : std::true_type {};
