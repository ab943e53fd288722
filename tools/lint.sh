#!/usr/bin/env bash
# The style the repository declares, checked (tools/test.sh runs this before the build):
# every C++ file of the repository as .clang-format says (Debian's clang-format 14), the
# Python as .flake8 says (flake8: pycodestyle and pyflakes), and README.md's layout table
# against the tree (tools/check_layout.py). Names what differs; exits 1 if anything does.
# To fix C++: clang-format -i FILE...
set -uo pipefail
cd "$(dirname "$0")/.."

rc=0
mapfile -t cxx < <(git ls-files '*.cc' '*.h' '*.c' '*.cu')
unformatted="$(clang-format --dry-run "${cxx[@]}" 2>&1 | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: .*clang-format.*/\1/p' | sort -u)"
if [[ -n "$unformatted" ]]; then
  echo "lint: these C++ files differ from clang-format's output (clang-format -i FILE fixes one):"
  echo "$unformatted" | sed 's/^/  /'
  rc=1
fi
if ! /usr/bin/python3 -m flake8 .; then  # Debian's, where python3-flake8 installs
  echo "lint: flake8 found the Python above off the style .flake8 declares"
  rc=1
fi
if ! /usr/bin/python3 tools/check_layout.py; then
  echo "lint: README.md's layout table does not match the tree (above)"
  rc=1
fi
if [[ $rc -eq 0 ]]; then
  echo "lint: ${#cxx[@]} C++ files and the Python follow the declared style; the layout table matches the tree"
fi
exit $rc
