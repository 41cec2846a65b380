// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Reading settings from the environment, for every transport: what a launcher (torchrun,
// srun, mpirun, chorusrun) says about the job, and chorus's own CHORUS_* variables. One
// reader, so every variable is parsed the same way and every error names the function that
// read it ("cuda_ipc_transport::from_env: CHORUS_CUDA_SLOTS is not a number: 'x'").

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <string>

#include <chorus/error.hpp>
#include <chorus/fwd.hpp>

namespace chorus::detail {

/// The environment as one caller reads it: values, numbers and ports, and errors that start
/// with the caller's name.
class env_reader {
public:
    explicit env_reader(char const* caller) noexcept : caller_(caller) {}

    /// The value of the first of `names` that is set and not empty, else "".
    static std::string get(std::initializer_list<char const*> names) {
        for (char const* n : names)
            if (char const* v = std::getenv(n); v && *v) return v;
        return {};
    }

    [[noreturn]] void fail(std::string const& what) const { throw invalid_argument(std::string(caller_) + ": " + what); }

    /// `value` (of variable `what`) as a whole decimal number.
    long long number(std::string const& value, char const* what) const {
        std::size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(value, &used);
        } catch (std::exception const&) {
            used = 0;
        }
        if (used == 0 || used != value.size()) fail(std::string(what) + " is not a number: '" + value + "'");
        return v;
    }

    /// A TCP port, 1 to 65535.
    std::uint16_t port(std::string const& value, char const* what) const {
        long long const p = number(value, what);
        if (p < 1 || p > 65535) fail(std::string(what) + " out of range: " + value);
        return static_cast<std::uint16_t>(p);
    }

    /// Variable `name` as a number of at least `min`, or `fallback` when it is not set.
    long long number_at_least(char const* name, long long min, long long fallback) const {
        std::string const v = get({name});
        if (v.empty()) return fallback;
        long long const n = number(v, name);
        if (n < min) fail(std::string(name) + (min == 1 ? " must be positive: " : " must not be negative: ") + v);
        return n;
    }

private:
    char const* caller_;
};

/// CHORUS_NT_COPY_BYTES: host memory's copies into a buffer of this many bytes and more stream
/// past the cache (memory.hpp, host_memory::copy_part, detail::nt_copy_bytes); 0: never
/// (returned as the largest size_t).
inline constexpr std::size_t nt_copy_bytes_default = std::size_t{64} << 20;
inline std::size_t nt_copy_bytes_from(env_reader const& env) {
    long long const b = env.number_at_least("CHORUS_NT_COPY_BYTES", 0, static_cast<long long>(nt_copy_bytes_default));
    return b == 0 ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(b);
}

/// The first host of a Slurm node list: "node[07-09,12],gpu3" -> "node07".
inline std::string first_slurm_host(std::string const& list) {
    std::size_t const end = list.find_first_of(",[");
    if (end == std::string::npos || list[end] == ',') return list.substr(0, end);
    std::size_t const close = list.find(']', end);
    std::size_t const item_end = list.find_first_of("-,]", end + 1);
    if (close == std::string::npos || item_end == std::string::npos) return {};
    std::string host = list.substr(0, end) + list.substr(end + 1, item_end - end - 1);
    // A suffix after the bracket ("rack[1-2]-node") belongs to every host.
    std::size_t const suffix_end = list.find_first_of(",[", close + 1);
    return host + list.substr(close + 1, suffix_end == std::string::npos ? std::string::npos : suffix_end - close - 1);
}

/// What a launcher tells a rank about its job.
struct launch_env {
    rank_t rank = 0, size = 1, local_rank = 0;
    std::string master_addr = "127.0.0.1";
    std::uint16_t master_port = 0;
    /// What identifies this job to its launcher, where one says: "slurm:JOB.STEP",
    /// "torchelastic:RUN_ID", "ompi:NAMESPACE"; empty otherwise. Two jobs never share it, so it
    /// serves as the job token where CHORUS_JOB_TOKEN is not set.
    std::string identity;
};

/// The launcher's variables, torchrun's names first:
/// - RANK, WORLD_SIZE, LOCAL_RANK; else Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID;
///   else Open MPI's OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK;
/// - MASTER_ADDR (else the first host of SLURM_JOB_NODELIST, else 127.0.0.1), MASTER_PORT
///   (required, except under Slurm, where 10000 + (131 SLURM_JOB_ID + SLURM_STEP_ID) % 50000
///   gives every job step its own: two steps of one allocation run at once);
/// - the job's identity: SLURM_JOB_ID and SLURM_STEP_ID, else TORCHELASTIC_RUN_ID, else
///   PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid.
/// Throws invalid_argument naming the variables that are missing or malformed.
inline launch_env read_launch_env(env_reader const& env) {
    std::string const rank = env.get({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"});
    std::string const size = env.get({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"});
    std::string const port = env.get({"MASTER_PORT"});
    std::string const slurm_job = env.get({"SLURM_JOB_ID"});
    std::string missing;
    if (rank.empty()) missing += " RANK (or SLURM_PROCID, OMPI_COMM_WORLD_RANK)";
    if (size.empty()) missing += " WORLD_SIZE (or SLURM_NTASKS, OMPI_COMM_WORLD_SIZE)";
    if (port.empty() && slurm_job.empty()) missing += " MASTER_PORT";
    if (!missing.empty()) env.fail("missing environment variables:" + missing);
    launch_env l;
    l.rank = static_cast<rank_t>(env.number(rank, "RANK"));
    l.size = static_cast<rank_t>(env.number(size, "WORLD_SIZE"));
    if (std::string v = env.get({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}); !v.empty())
        l.local_rank = static_cast<rank_t>(env.number(v, "LOCAL_RANK"));
    if (!slurm_job.empty()) {
        std::string const step = env.get({"SLURM_STEP_ID"});
        long long const job = env.number(slurm_job, "SLURM_JOB_ID");
        long long const step_id = step.empty() ? 0 : env.number(step, "SLURM_STEP_ID") % 1000000;
        l.identity = "slurm:" + slurm_job + "." + (step.empty() ? "batch" : step);
        l.master_port = static_cast<std::uint16_t>(10000 + (job % 50000 * 131 + step_id) % 50000);
    } else if (std::string run = env.get({"TORCHELASTIC_RUN_ID"}); !run.empty()) {
        l.identity = "torchelastic:" + run;
    } else if (std::string ns = env.get({"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}); !ns.empty()) {
        l.identity = "ompi:" + ns;
    }
    if (!port.empty()) l.master_port = env.port(port, "MASTER_PORT");
    if (std::string a = env.get({"MASTER_ADDR"}); !a.empty())
        l.master_addr = a;
    else if (std::string nodes = env.get({"SLURM_JOB_NODELIST", "SLURM_NODELIST"}); !nodes.empty())
        l.master_addr = first_slurm_host(nodes);
    return l;
}

} // namespace chorus::detail
