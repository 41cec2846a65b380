// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
//
// chorusrun: starts the ranks of a chorus job on this machine, like
// `torchrun --nproc_per_node` or `mpirun -n`.
//
//   chorusrun -n 4 ./prog args...
//   chorusrun -n 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 ./prog
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
// MASTER_PORT and CHORUS_JOB_TOKEN (generated unless set), which tcp_transport::from_env() reads.
// On node 0 chorusrun binds the rendezvous socket itself (a free port unless --master-port) and
// hands it to rank 0 as CHORUS_MASTER_FD, so no other process can take the port between choosing
// and using it: concurrent jobs never collide.
//
// Every output line is prefixed "[rankN] " (stdout to stdout, stderr to stderr), one write(2)
// per line so lines of different ranks do not mix. Signals (INT, TERM, HUP, QUIT, USR1, USR2)
// are forwarded to every rank's process group. When a rank exits non-zero or dies, the others
// get --stop-after-ms to exit by themselves (chorus propagates a failure to every rank, so they
// normally do, each printing its error), then SIGTERM, then SIGKILL after --grace-ms; chorusrun
// then exits with the first failed rank's status, after a line naming the rank that failed
// first: the one the ranks' own reports blame (below), else a rank killed by a signal chorusrun
// did not send, else the first to exit non-zero.
//
// Blame. Each rank's transport reports the rank it blames for a failure of its group (a dead,
// stopped or departed peer, not the first rank that noticed) on a pipe chorusrun hands down as
// CHORUS_BLAME_FD, one line "chorus-blame REPORTER BLAMED". A stopped rank never exits and
// one that left early may exit 0: only the survivors' reports can name them.

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <map>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
    int nproc = 0;
    int nnodes = 1;
    int node_rank = 0;
    std::string master_addr = "127.0.0.1";
    int master_port = 0;  // 0: choose a free one (node 0 of a one-node job only)
    long timeout_ms = 0;  // 0: the transport's default
    long stop_after_ms = 1000;
    long grace_ms = 2000;
    bool prefix = true;
    bool verbose = false;
    std::vector<char*> command;
};

[[noreturn]] void usage(char const* error) {
    if (error) std::fprintf(stderr, "chorusrun: %s\n", error);
    std::fprintf(stderr,
                 "usage: chorusrun -n N [options] [--] program [args...]\n"
                 "  -n, --nproc-per-node N  ranks to start on this node\n"
                 "  --nnodes M              nodes in the job (default 1)\n"
                 "  --node-rank K           this node's index, 0..M-1 (default 0); its ranks are K*N..K*N+N-1\n"
                 "  --master-addr A         rank 0's address (default 127.0.0.1; [::1] or ::1 for IPv6)\n"
                 "  --master-port P         rendezvous port (default: a free port; required with --nnodes > 1)\n"
                 "  --timeout-ms T          sets CHORUS_TIMEOUT_MS, the ranks' timeout for every wait\n"
                 "  --stop-after-ms T       after a rank failed, wait this long for the others (default 1000)\n"
                 "  --grace-ms T            after SIGTERM, wait this long before SIGKILL (default 2000)\n"
                 "  --no-prefix             do not prefix output lines with [rankN]\n"
                 "  -v, --verbose           say where the rendezvous listens and how ranks ended\n");
    std::exit(2);
}

long number(char const* text, char const* what, long lo, long hi) {
    char* end = nullptr;
    errno = 0;
    long const v = std::strtol(text, &end, 10);
    if (errno || !*text || *end || v < lo || v > hi) {
        std::string const msg = std::string(what) + " must be a number in " + std::to_string(lo) + ".." +
                                std::to_string(hi) + ", got '" + text + "'";
        usage(msg.c_str());
    }
    return v;
}

options parse(int argc, char** argv) {
    options o;
    int i = 1;
    auto value = [&](char const* name) -> char const* {
        if (i + 1 >= argc) usage((std::string(name) + " needs a value").c_str());
        return argv[++i];
    };
    for (; i < argc; ++i) {
        std::string const a = argv[i];
        if (a == "--") {
            ++i;
            break;
        }
        if (a.empty() || a[0] != '-') break;
        if (a == "-n" || a == "--nproc-per-node" || a == "--nproc_per_node") o.nproc = int(number(value("-n"), "-n", 1, 4096));
        else if (a == "--nnodes") o.nnodes = int(number(value("--nnodes"), "--nnodes", 1, 65536));
        else if (a == "--node-rank" || a == "--node_rank") o.node_rank = int(number(value("--node-rank"), "--node-rank", 0, 65535));
        else if (a == "--master-addr" || a == "--master_addr") o.master_addr = value("--master-addr");
        else if (a == "--master-port" || a == "--master_port") o.master_port = int(number(value("--master-port"), "--master-port", 1, 65535));
        else if (a == "--timeout-ms") o.timeout_ms = number(value("--timeout-ms"), "--timeout-ms", 1, 86400000);
        else if (a == "--stop-after-ms") o.stop_after_ms = number(value("--stop-after-ms"), "--stop-after-ms", 0, 600000);
        else if (a == "--grace-ms") o.grace_ms = number(value("--grace-ms"), "--grace-ms", 0, 600000);
        else if (a == "--no-prefix") o.prefix = false;
        else if (a == "-v" || a == "--verbose") o.verbose = true;
        else if (a == "-h" || a == "--help") usage(nullptr);
        else usage(("unknown option " + a).c_str());
    }
    for (; i < argc; ++i) o.command.push_back(argv[i]);
    o.command.push_back(nullptr);
    if (o.nproc == 0) usage("-n N is required");
    if (o.command.size() == 1) usage("no program to run");
    if (o.node_rank >= o.nnodes) usage("--node-rank must be below --nnodes");
    if (o.nnodes > 1 && o.master_port == 0) usage("--master-port is required with --nnodes > 1 (every node must use the same)");
    if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']')
        o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
    return o;
}

// ---- signals: a self-pipe, so that the poll loop sees them ----------------------------------

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
    int const saved = errno;
    unsigned char const b = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t const n = ::write(signal_pipe[1], &b, 1);
    errno = saved;
}

constexpr int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

void install_signals() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        std::perror("chorusrun: pipe");
        std::exit(1);
    }
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int s : forwarded_signals) ::sigaction(s, &sa, nullptr);
    ::sigaction(SIGCHLD, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher mid-job
}

// ---- the rendezvous socket ------------------------------------------------------------------

// Binds and listens on addr:port (port 0: the system picks). Returns the fd, not close-on-exec
// so rank 0 inherits it, and the port in `port`.
int bind_master(std::string const& addr, int& port) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    std::string const service = std::to_string(port);
    if (int const rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found); rc != 0) {
        std::fprintf(stderr, "chorusrun: cannot resolve --master-addr %s: %s\n", addr.c_str(), ::gai_strerror(rc));
        std::exit(1);
    }
    int fd = -1;
    int err = 0;
    for (addrinfo* ai = found; ai && fd < 0; ai = ai->ai_next) {
        fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int const one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) {
            err = errno;
            ::close(fd);
            fd = -1;
        }
    }
    ::freeaddrinfo(found);
    if (fd < 0) {
        std::fprintf(stderr, "chorusrun: cannot listen on %s:%d: %s\n", addr.c_str(), port, std::strerror(err));
        std::exit(1);
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    return fd;
}

std::string random_token() {
    unsigned char bytes[16] = {};
    int const fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && ::read(fd, bytes, sizeof bytes) == static_cast<ssize_t>(sizeof bytes);
    if (fd >= 0) ::close(fd);
    if (!ok) {  // still unique enough to keep concurrent jobs apart
        auto const t = static_cast<unsigned long long>(clock_type::now().time_since_epoch().count());
        std::snprintf(reinterpret_cast<char*>(bytes), sizeof bytes, "%llx", t ^ static_cast<unsigned long long>(::getpid()));
    }
    std::string hex;
    char const* digits = "0123456789abcdef";
    for (unsigned char b : bytes) {
        hex += digits[b >> 4];
        hex += digits[b & 15];
    }
    return hex;
}

// ---- ranks ----------------------------------------------------------------------------------

struct rank_process {
    int rank = 0;
    pid_t pid = -1;
    int out = -1, err = -1;           // read ends of the rank's stdout and stderr
    std::string out_line, err_line;   // partial lines
    bool exited = false;
    int status = 0;
};

void set_cloexec(int fd) { ::fcntl(fd, F_SETFD, FD_CLOEXEC); }

pid_t spawn(options const& o, int rank, int local_rank, int master_fd, int blame_fd, std::string const& port,
            std::string const& token, int& out_fd, int& err_fd) {
    int out[2], err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) {
        std::perror("chorusrun: pipe");
        std::exit(1);
    }
    set_cloexec(out[0]);
    set_cloexec(err[0]);
    std::fflush(nullptr);
    // Signals stay blocked across fork until the child has reset their handlers: a signal
    // caught in between would run our handler in the child and reach us through the pipe.
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old);
    pid_t const pid = ::fork();
    if (pid < 0) {
        std::perror("chorusrun: fork");
        std::exit(1);
    }
    if (pid == 0) {
        ::setpgid(0, 0);  // its own group: a signal to the group reaches what the rank starts
        for (int s : forwarded_signals) std::signal(s, SIG_DFL);
        std::signal(SIGCHLD, SIG_DFL);
        std::signal(SIGPIPE, SIG_DFL);
        ::sigprocmask(SIG_SETMASK, &old, nullptr);
        int const null = ::open("/dev/null", O_RDONLY);
        if (null >= 0) ::dup2(null, 0);
        ::dup2(o.prefix ? out[1] : 1, 1);
        ::dup2(o.prefix ? err[1] : 2, 2);
        ::close(out[1]);
        ::close(err[1]);
        auto set = [](char const* k, std::string const& v) { ::setenv(k, v.c_str(), 1); };
        int const world = o.nproc * o.nnodes;
        set("RANK", std::to_string(rank));
        set("WORLD_SIZE", std::to_string(world));
        set("LOCAL_RANK", std::to_string(local_rank));
        set("LOCAL_WORLD_SIZE", std::to_string(o.nproc));
        set("NODE_RANK", std::to_string(o.node_rank));
        set("GROUP_RANK", std::to_string(o.node_rank));
        set("MASTER_ADDR", o.master_addr);
        set("MASTER_PORT", port);
        set("CHORUS_JOB_TOKEN", token);
        if (o.timeout_ms) set("CHORUS_TIMEOUT_MS", std::to_string(o.timeout_ms));
        set("CHORUS_BLAME_FD", std::to_string(blame_fd));
        if (master_fd >= 0 && rank == 0) {
            set("CHORUS_MASTER_FD", std::to_string(master_fd));
        } else {
            ::unsetenv("CHORUS_MASTER_FD");
            if (master_fd >= 0) ::close(master_fd);
        }
        ::execvp(o.command[0], o.command.data());
        std::fprintf(stderr, "chorusrun: cannot run %s: %s\n", o.command[0], std::strerror(errno));
        ::_exit(127);
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::setpgid(pid, pid);  // also here: no race with a signal sent before the child ran setpgid
    ::close(out[1]);
    ::close(err[1]);
    out_fd = out[0];
    err_fd = err[0];
    return pid;
}

void write_all(int fd, std::string const& s) {
    std::size_t off = 0;
    while (off < s.size()) {
        ssize_t const n = ::write(fd, s.data() + off, s.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // stdout closed: drop the output, keep supervising
        off += static_cast<std::size_t>(n);
    }
}

// Reads what is there; writes every complete line with its prefix. Returns false at EOF.
bool pump(int fd, std::string& partial, int rank, int to) {
    char buf[65536];
    ssize_t const n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    std::string const prefix = "[rank" + std::to_string(rank) + "] ";
    if (n <= 0) {
        if (!partial.empty()) write_all(to, prefix + partial + "\n");
        partial.clear();
        return false;
    }
    partial.append(buf, static_cast<std::size_t>(n));
    std::string lines;
    std::size_t start = 0;
    for (std::size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1)
        lines += prefix + partial.substr(start, nl + 1 - start);
    partial.erase(0, start);
    if (partial.size() > (1u << 20)) {  // a huge line without newline: pass it on in pieces
        lines += prefix + partial + "\n";
        partial.clear();
    }
    if (!lines.empty()) write_all(to, lines);
    return true;
}

// The ranks' blame reports (see the top): which rank the most of them name.
struct blame_board {
    int fd = -1;  // the pipe's read end; -1 once it ended
    std::string partial;
    std::vector<std::pair<int, int>> reports;  // reporter, blamed; in arrival order

    void read() {
        char buf[4096];
        ssize_t const n = ::read(fd, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (n <= 0) {
            ::close(fd);
            fd = -1;
            return;
        }
        partial.append(buf, static_cast<std::size_t>(n));
        for (std::size_t nl; (nl = partial.find('\n')) != std::string::npos; partial.erase(0, nl + 1)) {
            int reporter = -1, blamed = -1;
            if (std::sscanf(partial.substr(0, nl).c_str(), "chorus-blame %d %d", &reporter, &blamed) == 2 && blamed >= 0)
                reports.emplace_back(reporter, blamed);
        }
    }
    /// The rank named by the most reports (the earliest named among equals), or -1.
    int culprit() const {
        std::map<int, int> votes;
        for (auto const& r : reports) ++votes[r.second];
        int best = -1;
        for (auto const& r : reports)
            if (best < 0 || votes.at(r.second) > votes.at(best)) best = r.second;
        return best;
    }
    std::string reporters_of(int blamed) const {
        std::string list;
        for (auto const& r : reports)
            if (r.second == blamed && r.first != blamed) list += (list.empty() ? "" : ", ") + std::to_string(r.first);
        return list;
    }
};

std::string describe(int status) {
    if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        int const s = WTERMSIG(status);
        char const* name = ::strsignal(s);
        return "killed by signal " + std::to_string(s) + (name ? std::string(" (") + name + ")" : std::string());
    }
    return "status " + std::to_string(status);
}

int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

} // namespace

int main(int argc, char** argv) {
    options o = parse(argc, argv);
    install_signals();

    int master_fd = -1;
    int port = o.master_port;
    if (o.node_rank == 0) master_fd = bind_master(o.master_addr, port);
    std::string token;
    if (char const* t = std::getenv("CHORUS_JOB_TOKEN"); t && *t) {
        token = t;
    } else if (o.nnodes > 1) {
        usage("set CHORUS_JOB_TOKEN to the same secret on every node of a multi-node job");
    } else {
        token = random_token();
    }
    if (o.verbose)
        std::fprintf(stderr, "chorusrun: %d rank(s), rendezvous at %s:%d\n", o.nproc * o.nnodes, o.master_addr.c_str(), port);

    blame_board blame;
    int blame_pipe[2];
    if (::pipe(blame_pipe) != 0) {
        std::perror("chorusrun: pipe");
        return 1;
    }
    set_cloexec(blame_pipe[0]);
    ::fcntl(blame_pipe[0], F_SETFL, O_NONBLOCK);
    blame.fd = blame_pipe[0];

    std::vector<rank_process> ranks(static_cast<std::size_t>(o.nproc));
    for (int l = 0; l < o.nproc; ++l) {
        auto& r = ranks[static_cast<std::size_t>(l)];
        r.rank = o.node_rank * o.nproc + l;
        r.pid = spawn(o, r.rank, l, master_fd, blame_pipe[1], std::to_string(port), token, r.out, r.err);
    }
    if (master_fd >= 0) ::close(master_fd);  // rank 0 has its own copy now
    ::close(blame_pipe[1]);                   // the ranks have theirs: the pipe ends with them

    int first_failed = -1;  // index into ranks
    int signalled = 0;      // a signal we forwarded; we exit 128 + it
    std::size_t running = ranks.size();
    auto stop_at = clock_type::time_point::max();  // SIGTERM the rest then
    bool stopping = false;                          // the SIGTERM went out
    auto kill_at = clock_type::time_point::max();  // SIGKILL the rest then

    auto send_all = [&](int sig) {
        for (auto& r : ranks)
            if (!r.exited) ::kill(-r.pid, sig);
    };

    for (;;) {
        std::vector<pollfd> fds;
        std::vector<std::pair<rank_process*, bool>> owner;  // rank, is stderr
        fds.push_back({signal_pipe[0], POLLIN, 0});
        owner.push_back({nullptr, false});
        fds.push_back({blame.fd, POLLIN, 0});  // ignored by poll once -1
        owner.push_back({nullptr, true});
        for (auto& r : ranks) {
            if (r.out >= 0) {
                fds.push_back({r.out, POLLIN, 0});
                owner.push_back({&r, false});
            }
            if (r.err >= 0) {
                fds.push_back({r.err, POLLIN, 0});
                owner.push_back({&r, true});
            }
        }
        if (running == 0 && fds.size() == 2 && blame.fd < 0) break;

        auto const now = clock_type::now();
        if (now >= stop_at) {
            send_all(SIGTERM);
            stopping = true;
            stop_at = clock_type::time_point::max();
            kill_at = now + std::chrono::milliseconds(o.grace_ms);
        }
        if (now >= kill_at) {
            send_all(SIGKILL);
            kill_at = clock_type::time_point::max();
        }
        auto const next = std::min(stop_at, kill_at);
        int wait_ms = -1;
        if (next != clock_type::time_point::max())
            wait_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()) + 1;
        if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
            std::perror("chorusrun: poll");
            send_all(SIGKILL);
            return 1;
        }

        if (blame.fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) blame.read();
        for (std::size_t i = 2; i < fds.size(); ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            auto [r, is_err] = owner[i];
            int& fd = is_err ? r->err : r->out;
            if (!pump(fd, is_err ? r->err_line : r->out_line, r->rank, is_err ? 2 : 1)) {
                ::close(fd);
                fd = -1;
            }
        }

        if (fds[0].revents & POLLIN) {
            unsigned char sigs[64];
            ssize_t const n = ::read(signal_pipe[0], sigs, sizeof sigs);
            for (ssize_t k = 0; k < n; ++k) {
                int const s = sigs[k];
                if (s == SIGCHLD) continue;
                if (o.verbose) std::fprintf(stderr, "chorusrun: forwarding signal %d to every rank\n", s);
                send_all(s);
                if (s == SIGINT || s == SIGTERM || s == SIGHUP || s == SIGQUIT) {
                    // A second one means "now": no more grace.
                    if (signalled) send_all(SIGKILL);
                    signalled = s;
                    kill_at = std::min(kill_at, clock_type::now() + std::chrono::milliseconds(o.grace_ms));
                }
            }
        }

        // Reap. A rank that exited closes its pipes; whatever it wrote is still read above.
        for (;;) {
            int status = 0;
            pid_t const pid = ::waitpid(-1, &status, WNOHANG);
            if (pid <= 0) break;
            for (std::size_t i = 0; i < ranks.size(); ++i) {
                auto& r = ranks[i];
                if (r.pid != pid || r.exited) continue;
                r.exited = true;
                r.status = status;
                --running;
                bool const failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
                if (o.verbose) std::fprintf(stderr, "chorusrun: rank %d: %s\n", r.rank, describe(status).c_str());
                // A rank killed by a signal that chorusrun did not send is a likelier root cause
                // than one that exited with an error because its peer failed, even when that one
                // is reaped a moment earlier: it takes the blame.
                bool const killed = WIFSIGNALED(status) && !stopping && !signalled;
                if (killed && first_failed >= 0 && !WIFSIGNALED(ranks[static_cast<std::size_t>(first_failed)].status))
                    first_failed = static_cast<int>(i);
                if (failed && first_failed < 0 && !signalled) {
                    first_failed = static_cast<int>(i);
                    if (running > 0) {
                        std::fprintf(stderr, "chorusrun: rank %d failed (%s); stopping the other ranks\n", r.rank,
                                     describe(status).c_str());
                        stop_at = clock_type::now() + std::chrono::milliseconds(o.stop_after_ms);
                    }
                }
            }
        }
    }

    if (signalled) {
        std::fprintf(stderr, "chorusrun: stopped by signal %d\n", signalled);
        return 128 + signalled;
    }
    if (first_failed >= 0) {
        auto const& failed = ranks[static_cast<std::size_t>(first_failed)];
        // The rank the reports blame, if it is one of ours; its status says how it ended (a
        // stopped rank: by chorusrun's signal; one that left early: maybe exit code 0).
        int const named = blame.culprit() - o.node_rank * o.nproc;
        auto const& r = named >= 0 && named < o.nproc ? ranks[static_cast<std::size_t>(named)] : failed;
        std::string const by = &r == &failed ? std::string() : "; named by ranks " + blame.reporters_of(r.rank);
        std::fprintf(stderr, "chorusrun: rank %d failed first (%s%s)\n", r.rank, describe(r.status).c_str(), by.c_str());
        return exit_code(exit_code(r.status) != 0 ? r.status : failed.status);
    }
    return 0;
}
