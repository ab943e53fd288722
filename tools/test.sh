#!/usr/bin/env bash
# The README's second command: set up this machine, check the declared style (tools/lint.sh,
# and tools/tidy.sh after the build), build everything (with clang's thread-safety analysis as
# errors: .bazelrc), run every test, and print
# "N passed, N failed, N skipped" counted from the test cases' own XML reports.
#
#   tools/test.sh [BAZEL TEST ARGS...]      e.g. tools/test.sh --config=asan
#
# Exits non-zero whenever Bazel does (a build error, a failed target, a crash after the report
# was written, an interrupted run) or the count shows a failure; the count is printed anyway.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1

# The declared style (.clang-format, .flake8): checked first, reported at the end.
tools/lint.sh
lint_rc=$?

# Bazel's build events name exactly the test reports of this invocation (cached results
# included), so reports left under bazel-testlogs by earlier runs or deleted targets never count.
events="$(mktemp /tmp/tpd-test-events.XXXXXX.json)"
trap 'rm -f "$events"' EXIT

# Every test runs for real: none is taken from the disk cache (.bazelrc) of an earlier run.
bazel test //... --nocache_test_results --build_event_json_file="$events" "$@"
bazel_rc=$?
# .clang-tidy's checks need the generated headers the build above made.
tools/tidy.sh
tidy_rc=$?
python3 tools/count_tests.py "$events"
count_rc=$?
bazel shutdown
if [[ $lint_rc -ne 0 ]]; then
  echo "tools/lint.sh found code off the declared style (above); the run fails whatever the count says"
  exit "$lint_rc"
fi
if [[ $tidy_rc -ne 0 ]]; then
  echo "tools/tidy.sh found code off .clang-tidy's checks (above); the run fails whatever the count says"
  exit "$tidy_rc"
fi
if [[ $bazel_rc -ne 0 ]]; then
  # 3: some target failed although everything built; anything else: the build or the
  # invocation broke, and the count above may be incomplete.
  echo "bazel test failed (exit $bazel_rc); the run fails whatever the count says"
  exit "$bazel_rc"
fi
exit $count_rc
