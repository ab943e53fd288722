#!/usr/bin/env python3
"""Counts test cases from the JUnit XML files Bazel leaves under bazel-testlogs.

Prints the closing line "N passed, N failed, N skipped" and exits 1 if any failed or if no
test ran. Each <testcase> counts once: failed if it holds <failure> or <error>, skipped if
gtest marked it skipped, passed otherwise. A test binary that crashed before writing its
report gets a report from Bazel with one failing case, so a crash is never counted as a pass.
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def main(testlogs: str) -> int:
    passed = failed = skipped = 0
    for report in sorted(pathlib.Path(testlogs).rglob("test.xml")):
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError as error:
            print(f"unreadable test report {report}: {error}")
            failed += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                print(f"FAILED: {case.get('classname')}.{case.get('name')} ({report.parent.name})")
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
