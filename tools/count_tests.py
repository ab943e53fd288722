#!/usr/bin/env python3
"""Counts the test cases of one `bazel test` invocation.

    count_tests.py BUILD_EVENTS_JSON

BUILD_EVENTS_JSON is the file `bazel test --build_event_json_file=...` wrote. Only the test
reports that invocation names are read: a target that no longer exists, or a report an
earlier run left under bazel-testlogs, is never counted. A result Bazel took from its cache
names the report of the run that produced it, which is this invocation's answer too.

Prints one line per failure and, last, "N passed, N failed, N skipped"; exits 1 if anything
failed or no test ran. Each <testcase> counts once: failed if it holds <failure> or <error>;
skipped if gtest skipped it (GTEST_SKIP) or did not run it (a DISABLED_ test, which gtest
reports as status="notrun" / result="suppressed"); passed otherwise. A target Bazel marks
failed (a crash, an abort or a hang after gtest wrote a report that shows no failure, or a
timeout) counts as one more failure, so a binary that dies at exit is never all passes.
"""
import json
import pathlib
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

# Bazel's TestStatus values (build_event_stream.proto) that mean the target passed.
PASSING = {"PASSED", "FLAKY"}


def report_path(uri: str) -> pathlib.Path:
    return pathlib.Path(urllib.request.url2pathname(urllib.parse.urlparse(uri).path))


def test_results(events_file: str):
    """The last attempt of every (target, run, shard): {key: (status, test.xml path or None)}."""
    results = {}
    with open(events_file, encoding="utf-8") as events:
        for line in events:
            line = line.strip()
            if not line:
                continue
            event = json.loads(line)
            if "testResult" not in event:
                continue
            ident = event["id"]["testResult"]
            key = (ident["label"], ident.get("run", 1), ident.get("shard", 1))
            attempt = ident.get("attempt", 1)
            body = event["testResult"]
            xml = None
            for output in body.get("testActionOutput", []):
                if output.get("name") == "test.xml" and "uri" in output:
                    xml = report_path(output["uri"])
            if key not in results or attempt >= results[key][0]:
                results[key] = (attempt, body.get("status", "NO_STATUS"), xml)
    return {key: (status, xml) for key, (_, status, xml) in results.items()}


def case_outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if (case.get("result") in ("skipped", "suppressed") or case.get("status") == "notrun"
            or case.find("skipped") is not None):
        return "skipped"
    return "passed"


def main(events_file: str) -> int:
    passed = failed = skipped = 0
    try:
        results = test_results(events_file)
    except (OSError, ValueError, KeyError) as error:
        print(f"cannot read Bazel's build events {events_file}: {error}")
        results = {}
    for (label, run, shard), (status, xml) in sorted(results.items()):
        where = label if (run, shard) == (1, 1) else f"{label} (run {run}, shard {shard})"
        case_failures = 0
        if xml is None or not xml.is_file():
            print(f"FAILED: {where}: no test report (Bazel status {status})")
            failed += 1
            continue
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError as error:
            print(f"FAILED: {where}: unreadable test report {xml}: {error}")
            failed += 1
            continue
        for case in root.iter("testcase"):
            outcome = case_outcome(case)
            if outcome == "failed":
                case_failures += 1
                print(f"FAILED: {case.get('classname')}.{case.get('name')} ({where})")
            elif outcome == "skipped":
                skipped += 1
            else:
                passed += 1
        failed += case_failures
        if status not in PASSING and case_failures == 0:
            # The report shows no failing case, yet the target failed: it crashed, aborted or
            # hung after the report was written (or timed out before any case failed).
            print(f"FAILED: {where}: Bazel status {status} although its report shows no "
                  "failing case (a crash, abort or hang at exit? see its test.log)")
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[0])
        print("usage: count_tests.py BUILD_EVENTS_JSON")
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
