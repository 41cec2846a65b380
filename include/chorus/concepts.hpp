// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// All of chorus's concepts, without the algorithms.
#include <chorus/memory.hpp>
#include <chorus/ranges.hpp>
#include <chorus/reduce/concepts.hpp>
#include <chorus/topology/concepts.hpp>
#include <chorus/transport/concepts.hpp>
