#!/usr/bin/env bash
# Runs an example under chorusrun and compares what it prints with the "Expected output"
# block at the top of its source (lines "//   [rankN] ..."). Lines of different ranks may
# interleave, so both sides are compared as sorted lists; each rank's own lines must also
# keep their order.
# Usage: check_example.sh CHORUSRUN EXAMPLE SOURCE [CHORUSRUN OPTIONS...]
set -uo pipefail
run=$1 example=$2 source=$3
shift 3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chorus-example.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

sed -n 's|^//   \(\[rank[0-9]*\] .*\)$|\1|p' "$source" >"$tmp/expected"
[ -s "$tmp/expected" ] || { echo "FAIL: no expected output in $source"; exit 1; }
ranks=$(sed 's/^\[rank\([0-9]*\)\].*/\1/' "$tmp/expected" | sort -n | tail -1)
"$run" -n $((ranks + 1)) --timeout-ms 30000 "$@" "$example" >"$tmp/actual" 2>"$tmp/stderr"
rc=$?
cat "$tmp/actual"
if [ "$rc" -ne 0 ] || [ -s "$tmp/stderr" ]; then
    echo "FAIL: exit status $rc, stderr:"
    cat "$tmp/stderr"
    exit 1
fi
if ! diff <(sort "$tmp/expected") <(sort "$tmp/actual") >"$tmp/diff"; then
    echo "FAIL: output differs from the Expected output of $source (< expected, > actual):"
    cat "$tmp/diff"
    exit 1
fi
for r in $(seq 0 "$ranks"); do
    if ! diff <(grep "^\[rank$r\] " "$tmp/expected") <(grep "^\[rank$r\] " "$tmp/actual") >/dev/null; then
        echo "FAIL: rank $r printed its lines in another order than expected"
        exit 1
    fi
done
echo "ok: $(wc -l <"$tmp/actual") lines as expected"
