#!/usr/bin/env bash
# The README's second command: set up this machine, build everything, run every test, and
# print "N passed, N failed" counted from the test cases' own XML reports.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1

bazel test //... "$@"
bazel_rc=$?
# Bazel exits 3 when tests failed but everything built; other non-zero codes mean the build
# or the invocation broke, and the count below cannot be trusted to be complete.
python3 tools/count_tests.py "$(bazel info bazel-testlogs)"
count_rc=$?
bazel shutdown
if [[ $bazel_rc -ne 0 && $bazel_rc -ne 3 ]]; then
  echo "bazel test failed to build or run (exit $bazel_rc)"
  exit "$bazel_rc"
fi
exit $count_rc
