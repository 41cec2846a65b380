// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The front doors' dispatch over a collective's list of algorithms (schedule.hpp): a tag's
// schedule, or the automatic choice with CHORUS_ALGO and CHORUS_DEBUG (select.hpp).

#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <chorus/detail/schedule.hpp>
#include <chorus/detail/select.hpp>
#include <chorus/detail/tags.hpp>
#include <chorus/error.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail {

template <class>
inline constexpr bool always_false = false;

/// The algorithms of collective `K`, tags in the order CHORUS_ALGO's error lists them.
template <collective_kind K, class... Algos>
struct algorithms {
    static constexpr collective_kind kind = K;
    template <class Algo>
    static constexpr bool contains = (std::same_as<Algo, Algos> || ...);
    /// The choice of a collective that has one schedule.
    static constexpr choice only() noexcept {
        static_assert(sizeof...(Algos) == 1);
        std::string_view const names[] = {Algos::name...};
        return {names[0], "the only schedule"};
    }
};

// A tag the collective does not have: the error's context names the list of those it has.
template <class List, class Algo>
constexpr void unsupported_algorithm() {
    static_assert(always_false<Algo>,
                  "chorus: this collective has no such algorithm; its algorithms are the tags of the "
                  "detail::algorithms<kind, tags...> in this instantiation, and chorus::automatic");
}

// A tag whose schedule needs more of the transport than it has (schedule_serves).
template <class Algo, class Transport>
constexpr void unserved_algorithm() {
    static_assert(always_false<Algo>,
                  "chorus: this algorithm does not run over this transport (one_shot needs a direct_transport: "
                  "shm_transport, cuda_ipc_transport; two_shot and zero_copy an exposing_transport: "
                  "cuda_ipc_transport, shm_transport; "
                  "see docs/concepts.md#direct_transport)");
}

template <collective_kind K, class Algo, class Transport, class... Args>
void run_schedule(Transport& tp, Args&... args) {
    static_assert(!std::is_null_pointer_v<std::remove_cv_t<decltype(schedule<K, Algo>)>>,
                  "chorus: an algorithm of a collective's list has no schedule: include its header");
    if constexpr (schedule_serves<Algo, Transport>) schedule<K, Algo>(tp, args...);
    else unserved_algorithm<Algo, Transport>();
}

// Runs the algorithm called `name` among those of `Algos` that apply to (T, Op); false if
// none is called so.
template <collective_kind K, class T, class Op, class... Algos, class Transport, class... Args>
bool run_named(std::string_view name, Transport& tp, Args&... args) {
    bool ran = false;
    auto const one = [&]<class A>() {
        if constexpr (schedule_applies<K, A, T, Op> && schedule_serves<A, Transport>) {
            if (!ran && name == A::name) {
                run_schedule<K, A>(tp, args...);
                ran = true;
            }
        }
    };
    (one.template operator()<Algos>(), ...);
    return ran;
}

// The automatic choice (`choose()`), CHORUS_ALGO applied over the algorithms that apply to
// (T, Op), logged, and run.
template <class T, class Op, collective_kind K, class... Algos, class Transport, class Choose, class... Args>
void run_automatic(algorithms<K, Algos...>, Transport& tp, std::size_t bytes, Choose const& choose, Args&... args) {
    std::array<std::string_view, sizeof...(Algos)> allowed{};
    std::size_t n = 0;
    ((schedule_applies<K, Algos, T, Op> && schedule_serves<Algos, Transport> ? void(allowed[n++] = Algos::name) : void()), ...);
    std::string_view const name = decide(tp, kind_name(K), bytes, choose(), std::span<std::string_view const>(allowed.data(), n));
    if (!run_named<K, T, Op, Algos...>(name, tp, args...)) {
        std::string const what = std::string(kind_name(K)) + ": the automatic choice '" + std::string(name) + "' does not apply";
        tp.abort(what.c_str());
        throw invalid_argument(what);
    }
}

/// A front door's body: the schedule of `Algo` from `List`, or for chorus::automatic the
/// choice `choose()` returns (CHORUS_ALGO may override it). `bytes` is what the choice's log
/// shows. `T` and `Op` say which algorithms apply (`Op` is void without a reduction).
template <class Algo, class List, class T, class Op, class Transport, class Choose, class... Args>
void run_collective(Transport& tp, std::size_t bytes, Choose const& choose, Args&... args) {
    if constexpr (std::same_as<Algo, automatic>) run_automatic<T, Op>(List{}, tp, bytes, choose, args...);
    else if constexpr (List::template contains<Algo>) run_schedule<List::kind, Algo>(tp, args...);
    else unsupported_algorithm<List, Algo>();
}

} // namespace chorus::detail
