#!/usr/bin/env bash
# Runs tpd's Python tests (tests/python) under Debian's python3 (which has python3-torch and
# python3-pytest from tools/setup.sh), with the binaries from the test's runfiles.
set -euo pipefail
R="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export TPD_DAEMON="$R/daemon/tpd"
export TPD_CLIENT_LIBRARY="$R/client/c/libtpd_client.so"
export PYTHONPATH="$R/python:$R/tests/python"
export PYTHONDONTWRITEBYTECODE=1
cd "$TEST_TMPDIR"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -q -rs \
  --junitxml="${XML_OUTPUT_FILE:-$TEST_TMPDIR/pytest.xml}" "$R/tests/python" "$@"
