// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// The request type of the transports: a move-only handle on one operation of an engine (the
// transport's shared state). Engines provide wait(op), test(op) and cancel(op) (noexcept); a
// handle destroyed before its operation completed cancels it, which fails the group (the
// peer's matching message would otherwise be lost).

#include <memory>
#include <utility>

namespace chorus::detail {

template <class Engine, class Op>
class request_handle {
public:
    request_handle() = default;
    request_handle(Engine* engine, std::shared_ptr<Op> op) noexcept : engine_(engine), op_(std::move(op)) {}
    request_handle(request_handle&& other) noexcept { swap(other); }
    request_handle& operator=(request_handle&& other) noexcept {
        request_handle(std::move(other)).swap(*this);
        return *this;
    }
    ~request_handle() {
        if (op_) engine_->cancel(op_);
    }

    /// Blocks until complete (at most the transport's timeout); throws timeout_error or
    /// transport_error. A second wait() returns at once.
    void wait() {
        if (!op_) return;
        engine_->wait(op_);
        op_.reset();
    }
    /// Whether the operation completed, without blocking; throws if it failed.
    bool test() {
        if (!op_) return true;
        if (!engine_->test(op_)) return false;
        op_.reset();
        return true;
    }

    /// Forgets the operation without cancelling it. Only for the owner of an engine that is
    /// about to be destroyed, which ends the operation with it (a staged transport's control
    /// receives at shutdown): cancelling would fail the group on every rank.
    void detach() noexcept { op_.reset(); }

private:
    void swap(request_handle& other) noexcept {
        std::swap(engine_, other.engine_);
        std::swap(op_, other.op_);
    }
    Engine* engine_ = nullptr;
    std::shared_ptr<Op> op_;  // null once complete (or for an operation that completed at once)
};

} // namespace chorus::detail
