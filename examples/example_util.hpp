// SPDX-License-Identifier: MIT
// Printing for the examples: values and lists the way the seed article's torch output
// shows them ([1.0, 2.0, 3.0] for floats, [1, 2, 3] for integers).
#pragma once

#include <charconv>
#include <concepts>
#include <string>

namespace example {

/// Python's repr of a float: shortest round-trip digits, with ".0" on whole numbers.
template <std::floating_point T>
std::string format_value(T v) {
    char buf[64];
    auto const end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    std::string s(buf, end);
    if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // not 1e+20, inf or nan
    return s;
}

template <std::integral T>
std::string format_value(T v) {
    return std::to_string(v);
}

/// "[a, b, c]"; `sep` goes between elements (the seed writes counts as "[1,2,3,1]").
template <class Range>
std::string format_list(Range const& values, char const* sep = ", ") {
    std::string s = "[";
    char const* before = "";
    for (auto const& v : values) {
        s += before + format_value(v);
        before = sep;
    }
    return s + "]";
}

} // namespace example
