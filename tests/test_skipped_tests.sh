#!/usr/bin/env bash
# tests/test_skipped_tests.sh - tools/skipped_tests.py (what tools/test.sh
# prints about skipped tests) on a made-up meson testlog: every SKIP is
# listed with its reason, nothing else is.
set -euo pipefail
script=$1 fixtures=$2
got=$(python3 "$script" "$fixtures/testlog/build-x/meson-logs/testlog.json" /nonexistent/testlog.json)
want="skipped (build-x): disk_store_mounts: test_disk_store: SKIP mounts (a full tmpfs): cannot mount a file system in a private mount namespace
skipped (build-x): gpu_ops: no GPU here
skipped (build-x): quiet: (the test gave no reason)"
if [ "$got" != "$want" ]; then
	printf 'expected:\n%s\ngot:\n%s\n' "$want" "$got" >&2
	exit 1
fi
echo "ok: skipped tests listed with their reasons"
