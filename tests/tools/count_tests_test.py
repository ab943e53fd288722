"""tools/count_tests.py counts only the reports Bazel's build events name, and fails a run
whenever a case or a target failed."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(os.environ.get("TEST_SRCDIR", ".")) / os.environ.get(
    "TEST_WORKSPACE", "tpd") / "tools" / "count_tests.py"

GTEST_REPORT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="0" disabled="1" errors="0" name="AllTests">
  <testsuite name="S" tests="4" failures="0" disabled="1" skipped="1" errors="0">
    <testcase name="Passes" status="run" result="completed" classname="S" />
    <testcase name="DISABLED_Off" status="notrun" result="suppressed" classname="S" />
    <testcase name="Skips" status="run" result="skipped" classname="S">
      <skipped message="needs root" />
    </testcase>
    <testcase name="AlsoPasses" status="run" result="completed" classname="S" />
  </testsuite>
</testsuites>
"""

FAILING_REPORT = """<testsuites><testsuite name="F">
  <testcase name="Breaks" classname="F"><failure message="expected 1" /></testcase>
</testsuite></testsuites>
"""


class CountTestsTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.dir.name)
        self.events = []

    def tearDown(self):
        self.dir.cleanup()

    def report(self, name, text):
        path = self.root / name
        path.write_text(text)
        return path

    def result(self, label, xml, status="PASSED", attempt=1):
        outputs = [{"name": "test.log", "uri": (self.root / "test.log").as_uri()}]
        if xml is not None:
            outputs.append({"name": "test.xml", "uri": xml.as_uri()})
        self.events.append({
            "id": {"testResult": {"label": label, "run": 1, "shard": 1, "attempt": attempt}},
            "testResult": {"testActionOutput": outputs, "status": status},
        })

    def count(self):
        events = self.root / "events.json"
        events.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        run = subprocess.run([sys.executable, str(SCRIPT), str(events)],
                             capture_output=True, text=True, check=False)
        return run.returncode, run.stdout.strip().splitlines()

    def test_disabled_and_skipped_cases_count_as_skipped(self):
        self.result("//a:a", self.report("a.xml", GTEST_REPORT))
        rc, lines = self.count()
        self.assertEqual(lines[-1], "2 passed, 0 failed, 2 skipped")
        self.assertEqual(rc, 0)

    def test_only_reports_named_by_the_events_count(self):
        # A stale report of an earlier run or a deleted target lies next to the real one.
        self.report("stale.xml", FAILING_REPORT)
        self.result("//a:a", self.report("a.xml", GTEST_REPORT))
        rc, lines = self.count()
        self.assertEqual(lines[-1], "2 passed, 0 failed, 2 skipped")
        self.assertEqual(rc, 0)

    def test_failing_case_fails_the_run(self):
        self.result("//f:f", self.report("f.xml", FAILING_REPORT), status="FAILED")
        rc, lines = self.count()
        self.assertIn("FAILED: F.Breaks (//f:f)", lines)
        self.assertEqual(lines[-1], "0 passed, 1 failed, 0 skipped")
        self.assertEqual(rc, 1)

    def test_target_that_crashed_after_its_report_fails_the_run(self):
        self.result("//c:c", self.report("c.xml", GTEST_REPORT), status="FAILED")
        rc, lines = self.count()
        self.assertTrue(any("//c:c: Bazel status FAILED" in line for line in lines), lines)
        self.assertEqual(lines[-1], "2 passed, 1 failed, 2 skipped")
        self.assertEqual(rc, 1)

    def test_target_without_report_fails_the_run(self):
        self.result("//t:t", None, status="TIMEOUT")
        rc, lines = self.count()
        self.assertEqual(lines[-1], "0 passed, 1 failed, 0 skipped")
        self.assertEqual(rc, 1)

    def test_flaky_target_counts_its_last_attempt(self):
        self.result("//r:r", self.report("r1.xml", FAILING_REPORT), status="FAILED", attempt=1)
        self.result("//r:r", self.report("r2.xml", GTEST_REPORT), status="PASSED", attempt=2)
        rc, lines = self.count()
        self.assertEqual(lines[-1], "2 passed, 0 failed, 2 skipped")
        self.assertEqual(rc, 0)

    def test_no_test_at_all_fails_the_run(self):
        rc, lines = self.count()
        self.assertEqual(lines[-1], "0 passed, 0 failed, 0 skipped")
        self.assertEqual(rc, 1)


if __name__ == "__main__":
    unittest.main()
