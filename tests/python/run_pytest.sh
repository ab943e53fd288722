#!/usr/bin/env bash
# Runs tpd's Python tests (tests/python) under Debian's python3 (which has python3-torch and
# python3-pytest from tools/setup.sh), with the binaries from the test's runfiles. Arguments go
# to pytest; a bare file name is one of tests/python's (also after --ignore=), and without one
# the whole folder runs.
set -euo pipefail
R="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export TPD_DAEMON="$R/daemon/tpd"
export TPD_CLIENT_LIBRARY="$R/client/c/libtpd_client.so"
export PYTHONPATH="$R/python:$R/tests/python"
export PYTHONDONTWRITEBYTECODE=1
args=()
files=0
for arg in "$@"; do
  if [[ $arg == --ignore=* ]]; then
    # A file of tests/python to leave out. (pytest makes a relative path, or --ignore-glob's
    # pattern, absolute from the current directory, which is not where the tests are.)
    args+=("--ignore=$R/tests/python/${arg#--ignore=}")
  elif [[ $arg == *.py && $arg != -* ]]; then
    args+=("$R/tests/python/$arg")
    files=$((files + 1))
  else
    args+=("$arg")
  fi
done
if [[ $files -eq 0 ]]; then
  args+=("$R/tests/python")
fi
cd "$TEST_TMPDIR"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q -rs \
  --junitxml="${XML_OUTPUT_FILE:-$TEST_TMPDIR/pytest.xml}" "${args[@]}"
