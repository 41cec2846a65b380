// SPDX-License-Identifier: MIT
// Printing for the examples: values and lists the way the seed article's torch output
// shows them ([1.0, 2.0, 3.0] for floats, [1, 2, 3] for integers).
#pragma once

#include <charconv>
#include <concepts>
#include <exception>
#include <iostream>
#include <string>
#include <type_traits>

#include <chorus/chorus.hpp>
#include <chorus/transport/node.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/tcp.hpp>

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

/// Whether got == want; if not, says so on stderr ("<what>: rank r got [...], expected [...]"),
/// so that a wrong result fails the example (and its test) with the values in view.
template <class Range>
bool check(char const* what, int rank, Range const& got, Range const& want) {
    if (got == want) return true;
    std::cerr << what << ": rank " << rank << " got " << format_list(got) << ", expected " << format_list(want)
              << std::endl;
    return false;
}

/// main() of every example: joins the job a launcher started (chorusrun, torchrun, srun,
/// mpirun) and returns body(tp) as the exit status; a chorus error (a peer that died, a timeout,
/// a missing variable) is printed and exits 1. The transport is CHORUS_TRANSPORT's: tcp (the
/// default, tcp_transport::from_env()), shm (every rank on this host, through shared memory) or
/// node (auto: shared memory inside each host, TCP between hosts): `body` takes any (`auto&
/// tp`). A body that takes only a tcp_transport (the CUDA example bootstraps its device
/// transport from one) runs over TCP, and the others are refused for it rather than ignored.
template <class Body>
int run_rank(Body body) {
    auto const over = [&]<class Tp>(std::type_identity<Tp>) -> int {
        if constexpr (std::is_invocable_v<Body&, Tp&>) {
            auto tp = Tp::from_env();
            return body(tp);
        } else {
            std::cerr << "error: this program runs over tcp_transport only: unset CHORUS_TRANSPORT" << std::endl;
            return 2;
        }
    };
    try {
        std::string const transport = chorus::detail::env_reader::get({"CHORUS_TRANSPORT"});
        if (transport.empty() || transport == "tcp") return over(std::type_identity<chorus::tcp_transport>{});
        if (transport == "shm") return over(std::type_identity<chorus::shm_transport>{});
        if (transport == "node" || transport == "auto") return over(std::type_identity<chorus::node_transport>{});
        std::cerr << "error: CHORUS_TRANSPORT must be tcp, shm, node or auto, not '" << transport << "'" << std::endl;
        return 2;
    } catch (chorus::error const& e) {
        std::cerr << "error: " << e.what() << std::endl;
        return 1;
    }
}

} // namespace example
