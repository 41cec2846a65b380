// SPDX-License-Identifier: MIT
// Debian's doctest ships no doctest_with_main library: this TU provides main().
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
