// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// A fiber: a function run on a stack of its own, in the thread that resumes it, until it
// yields (fiber::yield(), from inside) or returns. The nonblocking collectives (nonblocking.hpp)
// run the blocking schedules on fibers, so one schedule per collective serves both forms and
// no transport needs to be thread-safe: everything still happens in the caller's thread.
//
// ucontext (makecontext/swapcontext), with the sanitizers told of every switch: AddressSanitizer
// and ThreadSanitizer track one stack per thread and misread a switch they do not know of.
// An exception never crosses a switch: the fiber's function catches everything (the caller
// stores it).

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <new>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_FIBER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CHORUS_FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CHORUS_FIBER_TSAN 1
#endif
#endif
#if defined(CHORUS_FIBER_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(CHORUS_FIBER_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace chorus::detail {

class fiber {
public:
    /// Sanitizers grow frames several times: their builds get a larger stack. Pages are only
    /// committed when touched (MAP_NORESERVE), so the reservation costs address space only.
#if defined(CHORUS_FIBER_ASAN) || defined(CHORUS_FIBER_TSAN)
    static constexpr std::size_t stack_bytes = std::size_t{4} << 20;
#else
    static constexpr std::size_t stack_bytes = std::size_t{1} << 20;
#endif

    /// `body` must not throw (the caller wraps it).
    explicit fiber(std::function<void()> body) : body_(std::move(body)) {
        page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        void* const p = ::mmap(nullptr, stack_bytes + page_, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        mapping_ = p;
        ::mprotect(mapping_, page_, PROT_NONE);  // a guard page below the stack: overflow faults
        unpoison_stack();
        ::getcontext(&context_);
        context_.uc_stack.ss_sp = static_cast<char*>(mapping_) + page_;
        context_.uc_stack.ss_size = stack_bytes;
        context_.uc_link = nullptr;
        ::makecontext(&context_, &fiber::entry, 0);
#if defined(CHORUS_FIBER_TSAN)
        tsan_fiber_ = __tsan_create_fiber(0);
#endif
    }
    fiber(fiber const&) = delete;
    fiber& operator=(fiber const&) = delete;
    /// Pre: finished() or never resumed (a suspended fiber's stack holds live objects).
    ~fiber() {
#if defined(CHORUS_FIBER_TSAN)
        __tsan_destroy_fiber(tsan_fiber_);
#endif
        unpoison_stack();
        ::munmap(mapping_, stack_bytes + page_);
    }

    bool finished() const noexcept { return finished_; }

    /// Runs the fiber until it yields or returns. Pre: !finished(), not inside this fiber.
    void resume() noexcept {
        fiber* const outer = current_ref();
        current_ref() = this;
#if defined(CHORUS_FIBER_TSAN)
        caller_tsan_ = __tsan_get_current_fiber();
        __tsan_switch_to_fiber(tsan_fiber_, 0);
#endif
#if defined(CHORUS_FIBER_ASAN)
        void* fake = nullptr;
        __sanitizer_start_switch_fiber(&fake, context_.uc_stack.ss_sp, stack_bytes);
#endif
        switch_context(&caller_, &context_);
#if defined(CHORUS_FIBER_ASAN)
        __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
        current_ref() = outer;
    }

    /// From inside a fiber: back to the resume() that ran it. Outside a fiber: nothing.
    static void yield() noexcept {
        if (fiber* const f = current_ref()) f->switch_out(false);
    }

    /// The fiber running on this thread, or null.
    static fiber* current() noexcept { return current_ref(); }

private:
    static fiber*& current_ref() noexcept {
        thread_local fiber* running = nullptr;
        return running;
    }

    // AddressSanitizer keeps the redzones of a stack's frames poisoned in its shadow memory,
    // and a fiber's last frames never return: its stack is unpoisoned when made (the range may
    // have held another stack) and before it is unmapped (the range may be reused for anything).
    void unpoison_stack() noexcept {
#if defined(CHORUS_FIBER_ASAN)
        __asan_unpoison_memory_region(static_cast<char*>(mapping_) + page_, stack_bytes);
#endif
    }

    // Saves the running context in `from` and runs `to`; returns when `from` is resumed.
    static void switch_context(ucontext_t* from, ucontext_t const* to) noexcept {
#if defined(CHORUS_FIBER_ASAN)
        // AddressSanitizer's swapcontext interceptor prints a warning ("may produce false
        // positives") into every program's output; the annotations above make the switch safe,
        // and getcontext + setcontext make the same switch without the interceptor.
        volatile bool resumed = false;
        ::getcontext(from);
        if (resumed) return;
        resumed = true;
        ::setcontext(to);
#else
        ::swapcontext(from, to);
#endif
    }

    static void entry() noexcept {
        fiber* const self = current_ref();
        self->switched_in();
        self->body_();
        self->finished_ = true;
        self->switch_out(true);
    }

    void switched_in() noexcept {
#if defined(CHORUS_FIBER_ASAN)
        __sanitizer_finish_switch_fiber(fake_stack_, &caller_bottom_, &caller_size_);
#endif
    }

    void switch_out(bool last) noexcept {
#if defined(CHORUS_FIBER_ASAN)
        __sanitizer_start_switch_fiber(last ? nullptr : &fake_stack_, caller_bottom_, caller_size_);
#else
        (void)last;
#endif
#if defined(CHORUS_FIBER_TSAN)
        __tsan_switch_to_fiber(caller_tsan_, 0);
#endif
        switch_context(&context_, &caller_);
        switched_in();  // resumed again (never reached after the last switch)
    }

    std::function<void()> body_;
    void* mapping_ = nullptr;
    std::size_t page_ = 0;
    ucontext_t context_{}, caller_{};
    bool finished_ = false;
#if defined(CHORUS_FIBER_ASAN)
    void* fake_stack_ = nullptr;
    void const* caller_bottom_ = nullptr;
    std::size_t caller_size_ = 0;
#endif
#if defined(CHORUS_FIBER_TSAN)
    void* tsan_fiber_ = nullptr;
    void* caller_tsan_ = nullptr;
#endif
};

} // namespace chorus::detail
