// SPDX-License-Identifier: MIT
#pragma once

// Closed-form inputs and expected results for the collective tests, computed without the
// library: folds over the ranks in rank order (range-v3 views), in wide arithmetic, then cast
// to T.

#include <chorus/chorus.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <range/v3/numeric/accumulate.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

namespace oracle {

using chorus::rank_t;

enum class op_kind { sum, prod, minimum, maximum, avg, bit_and, bit_or, bit_xor };

inline char const* name(op_kind k) {
    switch (k) {
    case op_kind::sum: return "sum";
    case op_kind::prod: return "prod";
    case op_kind::minimum: return "minimum";
    case op_kind::maximum: return "maximum";
    case op_kind::avg: return "avg";
    case op_kind::bit_and: return "bit_and";
    case op_kind::bit_or: return "bit_or";
    case op_kind::bit_xor: return "bit_xor";
    }
    return "?";
}

/// Rank r's input element i for operation k. Small integers (exact in float, no overflow
/// in int8 for up to 8 ranks), negative where T is signed.
template <class T>
T value(op_kind k, rank_t r, std::size_t i) {
    long long const ri = r, ii = static_cast<long long>(i % 1000003);
    constexpr bool sign = std::is_signed_v<T>;
    switch (k) {
    case op_kind::sum:
    case op_kind::avg: return static_cast<T>((ri * 7 + ii * 3) % 11 - (sign ? 5 : 0));
    case op_kind::prod: {
        long long const mag = (ri + ii) % 4 == 0 ? 2 : 1;
        long long const neg = sign && (ri * 3 + ii) % 5 == 0 ? -1 : 1;
        return static_cast<T>(mag * neg);
    }
    case op_kind::minimum:
    case op_kind::maximum: return static_cast<T>((ri * 37 + ii * 11) % 101 - (sign ? 50 : 0));
    case op_kind::bit_and: return static_cast<T>(0x7f ^ (1 << ((ri + ii) % 7)));
    case op_kind::bit_or:
    case op_kind::bit_xor: return static_cast<T>((ri * 37 + ii * 11 + 5) & 0x7f);
    }
    return T{};
}

// One step of op k in wide arithmetic (double for floating-point T, long long otherwise).
template <class Wide>
Wide combine(op_kind k, Wide acc, Wide x) {
    switch (k) {
    case op_kind::sum:
    case op_kind::avg: return acc + x;
    case op_kind::prod: return acc * x;
    case op_kind::minimum: return x < acc ? x : acc;
    case op_kind::maximum: return x > acc ? x : acc;
    default: break;
    }
    if constexpr (std::is_integral_v<Wide>) {
        if (k == op_kind::bit_and) return acc & x;
        if (k == op_kind::bit_or) return acc | x;
        if (k == op_kind::bit_xor) return acc ^ x;
    }
    return acc;
}

/// The reduction over ranks 0..p-1 of value(k, r, i): rank 0's contribution, then the others
/// folded in in rank order, in wide arithmetic, then cast to T (AVG divides at the end).
template <class T>
T expected(op_kind k, rank_t p, std::size_t i) {
    using wide = std::conditional_t<std::is_floating_point_v<T>, double, long long>;
    auto const contribution = [&](rank_t r) { return static_cast<wide>(value<T>(k, r, i)); };
    wide const acc = ranges::accumulate(ranges::views::iota(rank_t{1}, p) | ranges::views::transform(contribution),
                                        contribution(0), [k](wide a, wide x) { return combine(k, a, x); });
    if (k != op_kind::avg) return static_cast<T>(acc);
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(static_cast<T>(acc) / static_cast<T>(p));
    else return static_cast<T>(acc / p);
}

/// Calls f(kind, op) for every built-in operation that applies to T.
template <class T, class F>
void for_each_op(F&& f) {
    f(op_kind::sum, chorus::sum{});
    f(op_kind::prod, chorus::prod{});
    f(op_kind::minimum, chorus::minimum{});
    f(op_kind::maximum, chorus::maximum{});
    f(op_kind::avg, chorus::avg{});
    if constexpr (std::is_integral_v<T>) {
        f(op_kind::bit_and, chorus::bit_and{});
        f(op_kind::bit_or, chorus::bit_or{});
        f(op_kind::bit_xor, chorus::bit_xor{});
    }
}

template <class... Ts, class F>
void for_each_type(F&& f) {
    (f.template operator()<Ts>(), ...);
}

/// The sizes every collective is checked at: 0, 1, p-1, p+1 and a large odd size.
inline std::vector<std::size_t> sizes(rank_t p) {
    return {0, 1, static_cast<std::size_t>(p - 1), static_cast<std::size_t>(p + 1), 4099};
}

inline std::vector<rank_t> const rank_counts{1, 2, 3, 4, 5, 7, 8};

/// A 2x2 matrix product modulo 2^32: associative, not commutative. Reducing matrices in
/// any order but rank order gives a different product, so it catches schedules that
/// reorder contributions.
struct mat2 {
    std::uint32_t a, b, c, d;
    friend bool operator==(mat2 const&, mat2 const&) = default;
};
struct matmul {
    mat2 operator()(mat2 const& x, mat2 const& y) const noexcept {
        return {x.a * y.a + x.b * y.c, x.a * y.b + x.b * y.d, x.c * y.a + x.d * y.c, x.c * y.b + x.d * y.d};
    }
};
inline mat2 matrix(rank_t r, std::size_t i) {
    auto const u = static_cast<std::uint32_t>(r), v = static_cast<std::uint32_t>(i);
    return {1 + u, (v + u) % 3, u * v % 5 + 1, 2 + v % 7};
}
inline mat2 matrix_product(rank_t p, std::size_t i) {
    mat2 acc = matrix(0, i);
    for (rank_t r = 1; r < p; ++r) acc = matmul{}(acc, matrix(r, i));
    return acc;
}

/// Collects failures from rank threads; the test thread checks it is empty.
class failures {
public:
    void add(std::string s) {
        std::lock_guard lock(mutex_);
        if (list_.size() < 20) list_.push_back(std::move(s));
        ++count_;
    }
    std::size_t count() const { return count_; }
    std::string report() const {
        std::ostringstream out;
        for (auto const& s : list_) out << s << '\n';
        return out.str();
    }

private:
    std::mutex mutex_;
    std::vector<std::string> list_;
    std::size_t count_ = 0;
};

/// Counts elements of `got` differing from want(i); records the first.
template <class T, class Want>
void compare(failures& f, std::string const& what, std::vector<T> const& got, Want want) {
    std::size_t wrong = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
        if (!(got[i] == want(i)) && wrong++ == 0) first = i;
    if (wrong) {
        std::ostringstream out;
        out << what << ": " << wrong << " wrong of " << got.size() << ", first at " << first;
        if constexpr (std::is_arithmetic_v<T>)
            out << " (got " << +got[first] << ", want " << +want(first) << ")";
        f.add(out.str());
    }
}

} // namespace oracle
