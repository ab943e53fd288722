# Sourced by the shell tests here: each case a JUnit <testcase> in $XML_OUTPUT_FILE (so
# tools/count_tests.py counts cases, skips included), a line on stdout for people.
#
#   JUNIT_SUITE=PackageTest; source junit_cases.sh
#   record NAME pass|fail|skip MESSAGE ...; finish    (exits 1 if any case failed)

junit_xml="${XML_OUTPUT_FILE:-/dev/null}"
junit_failures=0
junit_cases=""

record() {  # NAME OUTCOME(pass|fail|skip) MESSAGE
  local body=""
  case "$2" in
    fail) body="<failure message=\"$(printf '%s' "$3" | head -c 2000 | sed 's/&/\&amp;/g; s/</\&lt;/g; s/"/\&quot;/g')\"/>"
          junit_failures=$((junit_failures + 1)); echo "FAIL $1: $3" ;;
    skip) body="<skipped message=\"$3\"/>"; echo "SKIP $1: $3" ;;
    *) echo "PASS $1: $3" ;;
  esac
  local result=completed
  [[ "$2" == skip ]] && result=skipped
  junit_cases+="<testcase name=\"$1\" classname=\"${JUNIT_SUITE}\" status=\"run\" result=\"$result\">$body</testcase>"
}

finish() {
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="%s">%s</testsuite></testsuites>\n' \
    "$JUNIT_SUITE" "$junit_cases" > "$junit_xml"
  exit $((junit_failures > 0))
}
