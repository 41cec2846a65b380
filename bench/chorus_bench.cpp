// SPDX-License-Identifier: MIT
// chorus_bench: nccl-tests style benchmark of every collective and algorithm over
// tcp_transport, one rank per process.
//
// Usage: chorusrun -n 4 build/bench/chorus_bench [options]
//   -b BYTES -e BYTES -f FACTOR   sizes from -b to -e, times FACTOR (default 8, 64M, 4);
//                                 K/M/G suffixes are powers of 1024
//   --sizes 8,1K,64K,1M           an explicit list instead
//   --ops allreduce,broadcast     which collectives (default: all of allreduce broadcast
//                                 reduce allgather reduce_scatter alltoall alltoallv barrier)
//   --algo auto|all|NAME[,NAME]   which algorithms (default auto: chorus's own choice;
//                                 all: every algorithm of each collective; over shm,
//                                 `registered` is the automatic choice on buffers in a
//                                 registered shm_buffer, which the peers read where it lies)
//   --dtype float|double|int32|int64   element type (default float)
//   --op sum|prod|min|max|avg     reduce op (default sum; other than sum for float only)
//   -w N -n N                     warm-up and timed iterations (default: by size, as the
//                                 peers' benchmarks: 20+200 up to 64 KiB, 5+50 up to 1 MiB,
//                                 2+20 up to 16 MiB, 2+10 above)
//   --iter-scale S                scales that default (at least 1 warm-up, 3 timed), as
//                                 PEERS_ITER_SCALE does for the peers
//   --csv | --json                output format (default: a table)
//   --spread                      adds min_us and p90_us columns (fastest and 90th percentile
//                                 iteration), as PEERS_SPREAD=1 does for the peers
//   --stats                       (tcp) prints, per row and rank on stderr, what the socket
//                                 engine did per timed iteration (chorus::tcp_stats)
//   --transport tcp|shm|node|auto tcp_transport (default), shm_transport (one host) or
//                                 node_transport (shared memory inside a host, TCP between;
//                                 `auto` is node: one host makes it all shared memory); float
//                                 sum only over shm and node, whose rows' algo column reads
//                                 shm:ALGO or node:ALGO
//
// Method (the same as ../shared/peers/bench_common.h, so rows compare one to one): for each
// iteration, refill the inputs and reset the outputs (untimed), barrier (untimed), time the one
// collective call on every rank, check every output element (untimed). An iteration's time is
// the maximum over ranks; a row reports the median over timed iterations. `bytes` is the largest
// per-rank buffer as nccl-tests defines it (allgather: the gathered output; reduce_scatter: the
// input; alltoall(v): the send buffer); busbw = algbw x the nccl-tests factor (allreduce
// 2(n-1)/n; allgather, reduce_scatter, alltoall(v) (n-1)/n; broadcast and reduce 1). `wrong` is
// the number of wrong output elements over all ranks and iterations; it must be 0.

#include <chorus/chorus.hpp>
#include <chorus/transport/node.hpp>
#include <chorus/transport/shm.hpp>
#include <chorus/transport/tcp.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

using chorus::rank_t;

// ---- options ----------------------------------------------------------------------------

std::size_t parse_bytes(std::string const& s) {
    std::size_t used = 0;
    double const v = std::stod(s, &used);
    std::size_t mult = 1;
    if (used < s.size()) {
        switch (s[used]) {
        case 'k': case 'K': mult = std::size_t{1} << 10; break;
        case 'm': case 'M': mult = std::size_t{1} << 20; break;
        case 'g': case 'G': mult = std::size_t{1} << 30; break;
        default: throw std::invalid_argument("bad size '" + s + "'");
        }
    }
    return static_cast<std::size_t>(v * static_cast<double>(mult));
}

std::vector<std::string> split(std::string const& s) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    while (pos <= s.size()) {
        std::size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        if (end > pos) out.push_back(s.substr(pos, end - pos));
        pos = end + 1;
    }
    return out;
}

struct options {
    std::vector<std::size_t> sizes;
    std::vector<std::string> ops{"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "alltoallv", "barrier"};
    std::vector<std::string> algos{"auto"};
    std::string dtype = "float";
    std::string op = "sum";
    std::string transport = "tcp";
    int warmup = -1, iters = -1;
    double iter_scale = 1.0;
    bool spread = false, stats = false;
    enum { table, csv, json } format = table;
};

[[noreturn]] void usage(char const* what) {
    std::fprintf(stderr, "chorus_bench: %s\nsee the comment at the top of bench/chorus_bench.cpp for the options\n", what);
    std::exit(2);
}

options parse(int argc, char** argv) {
    options o;
    std::size_t b = 8, e = std::size_t{64} << 20;
    double f = 4;
    bool explicit_sizes = false;
    for (int i = 1; i < argc; ++i) {
        std::string const a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage((a + " needs a value").c_str());
            return argv[++i];
        };
        try {
            if (a == "-b") b = parse_bytes(value());
            else if (a == "-e") e = parse_bytes(value());
            else if (a == "-f") f = std::stod(value());
            else if (a == "--sizes") {
                for (auto const& s : split(value())) o.sizes.push_back(parse_bytes(s));
                explicit_sizes = true;
            } else if (a == "--ops") o.ops = split(value());
            else if (a == "--algo") o.algos = split(value());
            else if (a == "--dtype") o.dtype = value();
            else if (a == "--op") o.op = value();
            else if (a == "--transport") o.transport = value();
            else if (a == "-w") o.warmup = std::stoi(value());
            else if (a == "-n") o.iters = std::stoi(value());
            else if (a == "--iter-scale") o.iter_scale = std::stod(value());
            else if (a == "--spread") o.spread = true;
            else if (a == "--stats") o.stats = true;
            else if (a == "--csv") o.format = options::csv;
            else if (a == "--json") o.format = options::json;
            else usage(("unknown option " + a).c_str());
        } catch (std::logic_error const&) {
            usage(("bad value for " + a).c_str());
        }
    }
    if (!explicit_sizes) {
        if (f <= 1) usage("-f must be above 1");
        for (double s = static_cast<double>(b); s <= static_cast<double>(e); s *= f) o.sizes.push_back(static_cast<std::size_t>(s));
    }
    return o;
}

// ---- shapes and values (exact in every element type) -------------------------------------

enum class kind { rooted_or_whole, blocks, none };

struct collective_info {
    std::string_view name;
    kind shape;
    double busbw_factor(rank_t n) const {
        if (name == "allreduce") return 2.0 * (n - 1) / n;
        if (name == "broadcast" || name == "reduce") return 1.0;
        if (name == "barrier") return 0.0;
        return static_cast<double>(n - 1) / n;
    }
};

struct shape {
    std::size_t count = 0;  // elements of the reported buffer
    std::size_t chunk = 0;  // per-peer block for the block collectives
};

shape shape_for(collective_info const& c, std::size_t bytes, std::size_t elem, rank_t n) {
    std::size_t const elems = std::max<std::size_t>(1, bytes / elem);
    if (c.shape == kind::none) return {};
    if (c.shape == kind::rooted_or_whole) return {elems, elems};
    std::size_t const chunk = std::max<std::size_t>(1, elems / static_cast<std::size_t>(n));
    return {chunk * static_cast<std::size_t>(n), chunk};
}

// Rank r's element i in iteration it, per reduce op, chosen so that every result is exact:
// small sums, products of 1s and 2s (2^8 at most), distinct values for min/max.
long long input(std::string_view op, rank_t r, std::size_t i, int it) {
    auto const x = static_cast<long long>((i + static_cast<std::size_t>(it)) % 13);
    if (op == "prod") return 1 + (r + x) % 2;
    if (op == "min" || op == "max") return ((r * 7 + x * 5) % 23) - 11;
    return (r + 1) + x;  // sum, avg
}

double expected(std::string_view op, rank_t n, std::size_t i, int it) {
    double acc = static_cast<double>(input(op, 0, i, it));
    for (rank_t r = 1; r < n; ++r) {
        double const v = static_cast<double>(input(op, r, i, it));
        if (op == "prod") acc *= v;
        else if (op == "min") acc = std::min(acc, v);
        else if (op == "max") acc = std::max(acc, v);
        else acc += v;
    }
    return op == "avg" ? acc / n : acc;
}

// Broadcast / allgather / alltoall payload: distinct per (source, destination, element).
long long payload(rank_t src, rank_t dst, std::size_t j, int it) {
    return (src * 64 + dst) * 16 + static_cast<long long>((j + static_cast<std::size_t>(it)) % 16);
}

// ---- refilling and checking at memory speed -----------------------------------------------
// Every input and expected output above is periodic in its index: input() and expected() in
// (i + it) % 13, payload() in (j + it) % 16 within a block. So one period, laid out once per
// call and repeated to a few KiB, is copied into a buffer or compared with it block by block.
// Why it matters beyond the sweep's length: the untimed work between two timed calls is not
// neutral. On the CI VM a copy that follows 20-50 ms of work moving little memory runs up to
// 1.5x slower (an 8 MiB memcpy: 600 us after 5 ms of arithmetic or sleep, 915 us after 50 ms;
// docs/algorithms.md), so a refill of one division per element (about 15 ms per 16 MiB, and
// as much again to check) slowed chorus's large rows against the same call in the peers'
// benchmarks, whose refills are vectorised loops that stream memory the whole time.

// The periodic sequence period[(offset + it + i) % period.size()], i < about 4096 elements
// (fewer for a shorter buffer of n), cut at a whole number of periods so that it can be
// repeated.
template <class T>
std::vector<T> repeated(std::span<T const> period, int it, std::size_t offset, std::size_t n) {
    std::size_t const p = period.size();
    std::size_t const start = (offset + static_cast<std::size_t>(it)) % p;
    std::size_t const periods = std::clamp<std::size_t>((n + p - 1) / p, 1, 4096 / p);
    std::size_t const len = p * periods;
    // One rotated period, then doubled by copies. Not one modulo per element: for a buffer
    // (or an alltoall's block) of at most 4096 elements the pattern is as long as the buffer,
    // and computing it by division cost 80% of a 4-rank 64 KiB alltoall row's CPU time (perf),
    // time taken from the ranks still inside the timed call on an oversubscribed host.
    std::vector<T> r(len);
    std::copy(period.begin() + static_cast<std::ptrdiff_t>(start), period.end(), r.begin());
    std::copy(period.begin(), period.begin() + static_cast<std::ptrdiff_t>(start), r.begin() + static_cast<std::ptrdiff_t>(p - start));
    for (std::size_t have = p; have < len; have *= 2) std::memcpy(r.data() + have, r.data(), std::min(have, len - have) * sizeof(T));
    return r;
}

template <class T>
void fill_periodic(std::span<T> out, std::span<T const> period, int it, std::size_t offset = 0) {
    auto const r = repeated(period, it, offset, out.size());
    for (std::size_t at = 0; at < out.size(); at += r.size())
        std::memcpy(out.data() + at, r.data(), std::min(r.size(), out.size() - at) * sizeof(T));
}

// How many elements of `got` differ from the periodic sequence (compared as T: every expected
// value is one that T holds exactly, and a NaN counts as wrong).
template <class T>
std::size_t wrong_periodic(std::span<T const> got, std::span<T const> period, int it, std::size_t offset = 0) {
    auto const r = repeated(period, it, offset, got.size());
    std::size_t bad = 0;
    for (std::size_t at = 0; at < got.size(); at += r.size()) {
        std::size_t const m = std::min(r.size(), got.size() - at);
        for (std::size_t j = 0; j < m; ++j) bad += static_cast<std::size_t>(!(got[at + j] == r[j]));
    }
    return bad;
}

// One period of a reduction's inputs on rank `me` and of its exact result, as T computes it
// (integer AVG truncates).
template <class T>
struct period {
    static constexpr std::size_t length = 13;
    std::array<T, length> in{}, out{};
    period(std::string_view op, rank_t me, rank_t n) {
        for (std::size_t k = 0; k < length; ++k) {
            in[k] = static_cast<T>(input(op, me, k, 0));
            out[k] = static_cast<T>(expected(op, n, k, 0));
        }
    }
};

// One period of the payload block from `src` to `dst` (every element of a block: j from 0).
template <class T>
std::array<T, 16> payload_period(rank_t src, rank_t dst) {
    std::array<T, 16> a{};
    for (std::size_t k = 0; k < a.size(); ++k) a[k] = static_cast<T>(payload(src, dst, k, 0));
    return a;
}

// Block b of n-element blocks of v.
template <class T>
std::span<T> block_of(std::span<T> v, rank_t b, std::size_t n) {
    return v.subspan(static_cast<std::size_t>(b) * n, n);
}

// ---- the measurement loop ----------------------------------------------------------------

struct row {
    std::string op, algo;
    rank_t ranks;
    std::size_t bytes, count;
    double time_us, algbw, busbw;
    double wrong;
    double min_us, p90_us;  // --spread
};

// --stats: what this rank's TCP engine did per timed iteration (barrier and collective
// together), one line on stderr per row and rank. Only tcp_transport counts.
template <class Tp>
class socket_counters {
public:
    socket_counters(Tp& tp, bool on) : tp_(tp), on_(on) {}
    void start() {
        if constexpr (std::is_same_v<Tp, chorus::tcp_transport>)
            if (on_) first_ = tp_.stats();
    }
    void stop(std::string_view op, std::string const& algo, std::size_t bytes, int iterations) const {
        if constexpr (std::is_same_v<Tp, chorus::tcp_transport>) {
            if (!on_) return;
            chorus::tcp_stats const b = tp_.stats(), &a = first_;
            double const n = iterations;
            auto per = [n](std::uint64_t hi, std::uint64_t lo) { return static_cast<double>(hi - lo) / n; };
            std::fprintf(stderr,
                         "# stats %s %s %zu rank %d, per iteration: sent %.0f B in %.1f sendmsg (%.1f full), received "
                         "%.0f B in %.1f recv (%.1f empty), payload direct %.0f staged %.0f unexpected %.0f B, "
                         "%.1f polls, %.1f sleeps (%.0f us), %.1f yields\n",
                         std::string(op).c_str(), algo.c_str(), bytes, tp_.rank(), per(b.bytes_sent, a.bytes_sent),
                         per(b.send_calls, a.send_calls), per(b.send_full, a.send_full), per(b.bytes_received, a.bytes_received),
                         per(b.recv_calls, a.recv_calls), per(b.recv_empty, a.recv_empty), per(b.bytes_direct, a.bytes_direct),
                         per(b.bytes_staged, a.bytes_staged), per(b.bytes_unexpected, a.bytes_unexpected),
                         per(b.polls, a.polls), per(b.sleeps, a.sleeps), per(b.slept_ns, a.slept_ns) / 1e3,
                         per(b.yields, a.yields));
        }
    }

private:
    Tp& tp_;
    bool on_;
    [[maybe_unused]] chorus::tcp_stats first_{};
};

struct iteration_counts {
    int warmup, timed;
};

iteration_counts iterations(options const& o, std::size_t bytes) {
    iteration_counts c = bytes <= (64u << 10) ? iteration_counts{20, 200}
                         : bytes <= (1u << 20) ? iteration_counts{5, 50}
                         : bytes <= (16u << 20) ? iteration_counts{2, 20}
                                                : iteration_counts{2, 10};
    c.warmup = std::max(1, static_cast<int>(std::lround(c.warmup * o.iter_scale)));
    c.timed = std::max(3, static_cast<int>(std::lround(c.timed * o.iter_scale)));
    if (o.warmup >= 0) c.warmup = o.warmup;
    if (o.iters > 0) c.timed = o.iters;
    return c;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::size_t const m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct bench_case {
    std::function<void(int)> prepare;
    std::function<void()> run;
    std::function<std::size_t(int)> check;
    std::function<void()> done = [] {};  // collective: after the row (deregisters its memory)
};

template <class Tp>
row measure(Tp& tp, options const& o, collective_info const& c, std::string const& algo, shape s,
            std::size_t elem, bench_case const& bc) {
    std::size_t const bytes = s.count * elem;
    auto const its = iterations(o, bytes);
    std::vector<double> times(static_cast<std::size_t>(its.timed));
    double wrong = 0;
    socket_counters counters(tp, o.stats);
    for (int it = 0; it < its.warmup + its.timed; ++it) {
        if (it == its.warmup) counters.start();
        bc.prepare(it);
        chorus::barrier(tp);
        auto const t0 = std::chrono::steady_clock::now();
        bc.run();
        auto const t1 = std::chrono::steady_clock::now();
        wrong += static_cast<double>(bc.check(it));
        if (it >= its.warmup)
            times[static_cast<std::size_t>(it - its.warmup)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    counters.stop(c.name, algo, bytes, its.timed);
    chorus::allreduce(tp, times, chorus::maximum{});
    std::vector<double> w{wrong};
    chorus::allreduce(tp, w, chorus::sum{});
    double const t = median(times);
    std::ranges::sort(times);
    double const fastest = times.front(), p90 = times[std::min(times.size() - 1, times.size() * 9 / 10)];
    double const algbw = t > 0 && bytes > 0 ? static_cast<double>(bytes) / (t * 1e3) : 0.0;
    std::string const label = std::is_same_v<Tp, chorus::shm_transport>    ? "shm:" + algo
                              : std::is_same_v<Tp, chorus::node_transport> ? "node:" + algo
                                                                           : algo;
    return {std::string(c.name), label, tp.size(), bytes, s.count, t, algbw, algbw * c.busbw_factor(tp.size()), w[0], fastest, p90};
}

// ---- the collectives, per element type and reduce op ----------------------------------------

// A case's buffers: std::vectors, or (the `registered` rows over shm_transport) one shm_buffer
// registered with the peers, who then read it where it lies (transport/shm/exposure.hpp);
// release() deregisters it, on every rank alike.
template <class Tp, class T>
class case_memory {
public:
    case_memory(Tp& tp, std::vector<std::size_t> const& counts, bool registered) : tp_(tp), registered_(registered) {
        std::size_t total = 0;
        for (std::size_t n : counts) total += n;
        std::span<T> all;
        if constexpr (std::is_same_v<Tp, chorus::shm_transport>) {
            if (registered) {
                shared_ = chorus::shm_buffer(std::max<std::size_t>(total, 1) * sizeof(T));
                all = shared_.template as<T>().first(total);
                registration_ = chorus::register_buffer(tp, all);
                if (!registration_.kept()) throw std::runtime_error("chorus_bench: the peers could not map a shm_buffer");
            }
        }
        if (!registered) {
            plain_.resize(total);
            all = plain_;
        }
        for (std::size_t n : counts) {
            parts_.push_back(all.first(n));
            all = all.subspan(n);
        }
    }
    std::span<T> operator[](std::size_t i) const { return parts_[i]; }
    void release() {
        if constexpr (std::is_same_v<Tp, chorus::shm_transport>)
            if (registered_) chorus::deregister_buffer(tp_, registration_);
    }

private:
    [[maybe_unused]] Tp& tp_;
    bool registered_;
    std::vector<T> plain_;
    std::conditional_t<std::is_same_v<Tp, chorus::shm_transport>, chorus::shm_buffer, char> shared_{};
    chorus::registration registration_;
    std::vector<std::span<T>> parts_;
};

template <class T>
T sentinel() {
    return static_cast<T>(-7);
}

template <class Tp, class T, class Op>
class suite {
public:
    suite(Tp& tp, options const& o, Op op) : tp_(tp), o_(o), op_(op) {}

    /// The algorithms of collective `name`, each a (name, case builder) pair.
    void run(collective_info const& c, std::size_t req_bytes, std::vector<row>& out) {
        shape const s = shape_for(c, req_bytes, sizeof(T), tp_.size());
        for (auto const& [algo, make] : algorithms(c.name, s)) {
            if (!wanted(algo)) continue;
            bench_case bc = make();
            out.push_back(measure(tp_, o_, c, algo, s, sizeof(T), bc));
            bc.done();
        }
    }

private:
    using maker = std::function<bench_case()>;

    bool wanted(std::string const& algo) const {
        for (auto const& a : o_.algos)
            if (a == "all" || a == algo || (a == "auto" && algo == "auto")) return true;
        return false;
    }

    std::vector<std::pair<std::string, maker>> algorithms(std::string_view name, shape s) {
        rank_t const p = tp_.size(), me = tp_.rank();
        auto const up = static_cast<std::size_t>(p);
        std::string const opname = o_.op;
        std::vector<std::pair<std::string, maker>> list;
        if (name == "allreduce") {
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this, s, me, p, opname, algo] {
                    auto const tab = std::make_shared<period<T> const>(opname, me, p);
                    auto mem = memory({s.count}, algo);
                    std::span<T> const buf = (*mem)[0];
                    return bench_case{[=](int it) { fill_periodic<T>(buf, tab->in, it); },
                                      [this, buf] { chorus::allreduce<Algo>(tp_, buf, op_); },
                                      [=](int it) { return wrong_periodic<T>(buf, tab->out, it); }, [mem] { mem->release(); }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            add.template operator()<chorus::ring>("ring");
            add.template operator()<chorus::rabenseifner>("rabenseifner");
            add.template operator()<chorus::recursive_doubling>("recursive_doubling");
            add.template operator()<chorus::tree>("tree");
            add.template operator()<chorus::hierarchical>("hierarchical");
            if constexpr (chorus::direct_transport<Tp>)
                if (direct(s.count * sizeof(T))) add.template operator()<chorus::one_shot>("one_shot");
            if (registers()) add.template operator()<chorus::automatic>("registered");
        } else if (name == "reduce_scatter") {
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this, s, me, p, opname, algo] {
                    auto const tab = std::make_shared<period<T> const>(opname, me, p);
                    auto mem = memory({s.count, s.chunk}, algo);
                    std::span<T> const send = (*mem)[0], recv = (*mem)[1];
                    return bench_case{[=](int it) {
                                          fill_periodic<T>(send, tab->in, it);
                                          std::fill(recv.begin(), recv.end(), sentinel<T>());
                                      },
                                      [this, send, recv] { chorus::reduce_scatter<Algo>(tp_, send, recv, op_); },
                                      [=](int it) {
                                          return wrong_periodic<T>(recv, tab->out, it, static_cast<std::size_t>(me) * s.chunk);
                                      },
                                      [mem] { mem->release(); }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            add.template operator()<chorus::ring>("ring");
            add.template operator()<chorus::tree>("tree");
            if constexpr (chorus::direct_transport<Tp>)
                if (direct(s.count * sizeof(T))) add.template operator()<chorus::one_shot>("one_shot");
            if (registers()) add.template operator()<chorus::automatic>("registered");
        } else if (name == "reduce") {
            list.emplace_back("auto", [this, s, me, p, opname] {
                auto const tab = std::make_shared<period<T> const>(opname, me, p);
                auto send = std::make_shared<std::vector<T>>(s.count);
                auto recv = std::make_shared<std::vector<T>>(me == 0 ? s.count : 0);
                return bench_case{[=](int it) {
                                      fill_periodic<T>(*send, tab->in, it);
                                      std::fill(recv->begin(), recv->end(), sentinel<T>());
                                  },
                                  [this, send, recv] { chorus::reduce(tp_, *send, *recv, op_, 0); },
                                  [=](int it) { return wrong_periodic<T>(*recv, tab->out, it); }};
            });
        } else if (name == "broadcast") {
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this, s, me, algo] {
                    auto mem = memory({s.count}, algo);
                    std::span<T> const buf = (*mem)[0];
                    return bench_case{[=](int it) {
                                          if (me == 0) fill_periodic<T>(buf, payload_period<T>(0, 0), it);
                                          else std::fill(buf.begin(), buf.end(), sentinel<T>());
                                      },
                                      [this, buf] { chorus::broadcast<Algo>(tp_, buf, 0); },
                                      [=](int it) { return wrong_periodic<T>(buf, payload_period<T>(0, 0), it); },
                                      [mem] { mem->release(); }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            add.template operator()<chorus::tree>("tree");
            add.template operator()<chorus::linear>("linear");
            add.template operator()<chorus::scatter_allgather>("scatter_allgather");
            if constexpr (chorus::direct_transport<Tp>)
                if (direct(s.count * sizeof(T))) add.template operator()<chorus::one_shot>("one_shot");
            if (registers()) add.template operator()<chorus::automatic>("registered");
        } else if (name == "allgather") {
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this, s, me, p, algo] {
                    auto mem = memory({s.chunk, s.count}, algo);
                    std::span<T> const send = (*mem)[0], recv = (*mem)[1];
                    return bench_case{[=](int it) {
                                          fill_periodic<T>(send, payload_period<T>(me, 0), it);
                                          std::fill(recv.begin(), recv.end(), sentinel<T>());
                                      },
                                      [this, send, recv] { chorus::allgather<Algo>(tp_, std::span<T const>(send), recv); },
                                      [=](int it) {
                                          std::size_t bad = 0;
                                          for (rank_t src = 0; src < p; ++src)
                                              bad += wrong_periodic<T>(block_of(recv, src, s.chunk), payload_period<T>(src, 0), it);
                                          return bad;
                                      },
                                      [mem] { mem->release(); }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            add.template operator()<chorus::ring>("ring");
            add.template operator()<chorus::bruck>("bruck");
            if constexpr (chorus::direct_transport<Tp>)
                if (direct(s.chunk * sizeof(T))) add.template operator()<chorus::one_shot>("one_shot");
            if (registers()) add.template operator()<chorus::automatic>("registered");
        } else if (name == "alltoall" || name == "alltoallv") {
            bool const v = name == "alltoallv";
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this, s, me, p, up, v, algo] {
                    auto mem = memory({s.count, s.count}, algo);
                    std::span<T> const send = (*mem)[0], recv = (*mem)[1];
                    auto counts = std::make_shared<std::vector<std::size_t>>(up, s.chunk);
                    return bench_case{[=](int it) {
                                          for (rank_t dst = 0; dst < p; ++dst)
                                              fill_periodic<T>(block_of(send, dst, s.chunk), payload_period<T>(me, dst), it);
                                          std::fill(recv.begin(), recv.end(), sentinel<T>());
                                      },
                                      [this, send, recv, counts, v] {
                                          if (v) chorus::alltoallv(tp_, std::span<T const>(send), *counts, recv, *counts);
                                          else chorus::alltoall<Algo>(tp_, std::span<T const>(send), recv);
                                      },
                                      [=](int it) {
                                          std::size_t bad = 0;
                                          for (rank_t src = 0; src < p; ++src)
                                              bad += wrong_periodic<T>(block_of(recv, src, s.chunk), payload_period<T>(src, me), it);
                                          return bad;
                                      },
                                      [mem] { mem->release(); }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            if (registers()) add.template operator()<chorus::automatic>("registered");
            if (!v) {
                add.template operator()<chorus::pairwise>("pairwise");
                add.template operator()<chorus::bruck>("bruck");
                if constexpr (chorus::direct_transport<Tp>)
                    if (direct(s.count * sizeof(T))) add.template operator()<chorus::one_shot>("one_shot");
            }
        } else if (name == "barrier") {
            auto add = [&]<class Algo>(std::string algo) {
                list.emplace_back(algo, [this] {
                    return bench_case{[](int) {}, [this] { chorus::barrier<Algo>(tp_); }, [](int) { return std::size_t{0}; }};
                });
            };
            add.template operator()<chorus::automatic>("auto");
            add.template operator()<chorus::dissemination>("dissemination");
            if constexpr (chorus::direct_transport<Tp>)
                if (direct(0)) add.template operator()<chorus::one_shot>("one_shot");
        }
        return list;
    }

    // The `registered` rows: automatic over registered shm_buffers (shm_transport only).
    static constexpr bool registers() { return std::is_same_v<Tp, chorus::shm_transport>; }
    std::shared_ptr<case_memory<Tp, T>> memory(std::vector<std::size_t> const& counts, std::string const& algo) {
        return std::make_shared<case_memory<Tp, T>>(tp_, counts, algo == "registered");
    }

    // Whether one_shot takes a block of this many bytes (over a direct_transport).
    bool direct(std::size_t block_bytes) const
        requires chorus::direct_transport<Tp>
    {
        return block_bytes <= tp_.direct_bytes();
    }

    Tp& tp_;
    options const& o_;
    Op op_;
};

void print(options const& o, std::vector<row> const& rows, bool header) {
    for (auto const& r : rows) {
        if (o.format == options::csv) {
            if (header) std::printf("op,algo,ranks,bytes,count,time_us,algbw_GBps,busbw_GBps,wrong%s\n", o.spread ? ",min_us,p90_us" : "");
            std::printf("%s,%s,%d,%zu,%zu,%.2f,%.4f,%.4f,%.0f", r.op.c_str(), r.algo.c_str(), r.ranks, r.bytes, r.count,
                        r.time_us, r.algbw, r.busbw, r.wrong);
            if (o.spread) std::printf(",%.2f,%.2f", r.min_us, r.p90_us);
            std::printf("\n");
        } else if (o.format == options::json) {
            std::printf("%s{\"op\":\"%s\",\"algo\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"count\":%zu,\"time_us\":%.2f,"
                        "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"wrong\":%.0f",
                        header ? "[" : ",", r.op.c_str(), r.algo.c_str(), r.ranks, r.bytes, r.count, r.time_us, r.algbw,
                        r.busbw, r.wrong);
            if (o.spread) std::printf(",\"min_us\":%.2f,\"p90_us\":%.2f", r.min_us, r.p90_us);
            std::printf("}\n");
        } else {
            if (header)
                std::printf("# %-14s %-18s %5s %12s %10s %12s %11s %11s %8s%s\n", "op", "algo", "ranks", "bytes", "count",
                            "time_us", "algbw_GBps", "busbw_GBps", "wrong", o.spread ? "       min_us       p90_us" : "");
            std::printf("%-16s %-18s %5d %12zu %10zu %12.2f %11.4f %11.4f %8.0f", r.op.c_str(), r.algo.c_str(), r.ranks,
                        r.bytes, r.count, r.time_us, r.algbw, r.busbw, r.wrong);
            if (o.spread) std::printf(" %12.2f %12.2f", r.min_us, r.p90_us);
            std::printf("\n");
        }
        header = false;
        std::fflush(stdout);
    }
}

template <class T, class Tp, class Op>
int run_suite(Tp& tp, options const& o, Op op) {
    static collective_info const infos[] = {{"allreduce", kind::rooted_or_whole}, {"broadcast", kind::rooted_or_whole},
                                            {"reduce", kind::rooted_or_whole},    {"allgather", kind::blocks},
                                            {"reduce_scatter", kind::blocks},     {"alltoall", kind::blocks},
                                            {"alltoallv", kind::blocks},          {"barrier", kind::none}};
    suite<Tp, T, Op> s(tp, o, op);
    bool header = true;
    double wrong = 0;
    for (auto const& name : o.ops) {
        auto const* info = std::find_if(std::begin(infos), std::end(infos), [&](auto const& i) { return i.name == name; });
        if (info == std::end(infos)) usage(("unknown collective " + name).c_str());
        for (std::size_t bytes : info->shape == kind::none ? std::vector<std::size_t>{0} : o.sizes) {
            std::vector<row> rows;
            s.run(*info, bytes, rows);
            for (auto const& r : rows) wrong += r.wrong;
            if (tp.rank() == 0) {
                print(o, rows, header);
                if (!rows.empty()) header = false;
            }
        }
    }
    if (tp.rank() == 0 && o.format == options::json) std::printf(header ? "[]\n" : "]\n");
    return wrong == 0 ? 0 : 3;
}

// Every op for float, sum for the other types: each (type, op) pair instantiates every
// algorithm, and all twenty pairs would take minutes to compile for little information (the
// kernels differ by one operator).
template <class T, class Tp>
int run_type(Tp& tp, options const& o) {
    if (o.op == "sum") return run_suite<T>(tp, o, chorus::sum{});
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Tp, chorus::tcp_transport>) {
        if (o.op == "prod") return run_suite<T>(tp, o, chorus::prod{});
        if (o.op == "min") return run_suite<T>(tp, o, chorus::minimum{});
        if (o.op == "max") return run_suite<T>(tp, o, chorus::maximum{});
        if (o.op == "avg") return run_suite<T>(tp, o, chorus::avg{});
        usage(("unknown --op " + o.op).c_str());
    }
    usage(("--op " + o.op + " is built for --dtype float over tcp only").c_str());
}

template <class Tp>
int run_transport(Tp& tp, options const& o, char const* name) {
    if (tp.rank() == 0 && o.format == options::table)
        std::printf("# chorus_bench: %d ranks over %s, dtype %s, op %s\n", tp.size(), name, o.dtype.c_str(), o.op.c_str());
    if (o.dtype == "float") return run_type<float>(tp, o);
    // Float only over shared memory and nodes: each further type instantiates every algorithm again.
    if constexpr (std::is_same_v<Tp, chorus::tcp_transport>) {
        if (o.dtype == "double") return run_type<double>(tp, o);
        if (o.dtype == "int32") return run_type<std::int32_t>(tp, o);
        if (o.dtype == "int64") return run_type<std::int64_t>(tp, o);
    }
    usage(("unknown --dtype " + o.dtype + " (over shm and node: float only)").c_str());
}

} // namespace

int main(int argc, char** argv) {
    options const o = parse(argc, argv);
    try {
        if (o.transport == "shm") {
            auto tp = chorus::shm_transport::from_env();
            return run_transport(tp, o, "shm_transport");
        }
        if (o.transport == "node" || o.transport == "auto") {
            auto tp = chorus::node_transport::from_env();
            if (tp.rank() == 0 && o.format == options::table)
                std::printf("# node_transport: %d nodes, %d ranks on this rank's node\n", tp.nodes(), tp.local_size());
            return run_transport(tp, o, "node_transport");
        }
        if (o.transport != "tcp") usage(("unknown --transport " + o.transport).c_str());
        auto tp = chorus::tcp_transport::from_env();
        return run_transport(tp, o, "tcp_transport");
    } catch (chorus::error const& e) {
        std::fprintf(stderr, "chorus_bench: %s\n", e.what());
        return 1;
    }
}
