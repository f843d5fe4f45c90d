#!/usr/bin/env python3
"""tools/skipped_tests.py - what meson skipped, and why.

Reads meson's testlog.json files (one JSON object per test run) and prints
one line per skipped test: the build folder, the test's name and its reason
(the last line the test wrote that says SKIP, else its last line).
tools/test.sh runs it before its summary line.

usage: tools/skipped_tests.py BUILD_DIR/meson-logs/testlog.json...
"""
import json
import os
import sys


def reason(test):
    lines = ((test.get("stderr") or "") + "\n" + (test.get("stdout") or "")).strip().splitlines()
    lines = [l.strip() for l in lines if l.strip()]
    for line in reversed(lines):
        if "SKIP" in line:
            return line
    return lines[-1] if lines else "(the test gave no reason)"


def main(paths):
    for path in paths:
        if not os.path.exists(path):
            continue
        build = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                test = json.loads(line)
                if test.get("result") == "SKIP":
                    print(f"skipped ({build}): {test.get('name')}: {reason(test)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
