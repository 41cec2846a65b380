// SPDX-License-Identifier: MIT
// SPDX-FileCopyrightText: chorus developers
#pragma once

// Three macros, not one literal: with a 0.x version a single literal would need leading
// zeros, which C reads as octal. CMake parses these lines for project(VERSION).
#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1
#define CHORUS_VERSION_PATCH 0
#define CHORUS_VERSION (CHORUS_VERSION_MAJOR * 10000 + CHORUS_VERSION_MINOR * 100 + CHORUS_VERSION_PATCH)
