#!/usr/bin/env bash
# Runs a single-process example and compares what it prints, in any order, with the lines
# "//   [rankN] ..." of its source's header.
# Usage: check_prints.sh PROGRAM SOURCE
set -euo pipefail
diff <(sed -n 's|^//   \(\[rank[0-9]*\] .*\)$|\1|p' "$2" | sort) <("$1" | sort)
echo "ok"
