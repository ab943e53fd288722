"""The Grafana dashboard (deploy/grafana-tpd.json) stays true to the daemon: it is valid JSON
of Grafana's dashboard shape, every series it queries is one daemon/metrics.cc exports (a
renamed metric breaks this test, not an operator's graph), and every query is PromQL that
promtool accepts (Grafana's $variables replaced by values of their kind)."""

import json
import os
import pathlib
import re
import subprocess
import tempfile
import unittest

ROOT = pathlib.Path(os.environ.get("TEST_SRCDIR", ".")) / os.environ.get("TEST_WORKSPACE", "")
PROMTOOLS = ("/usr/local/share/tpd/prometheus/usr/bin/promtool", "/usr/bin/promtool")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard():
    return json.loads((ROOT / "deploy/grafana-tpd.json").read_text())


def queries():
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def exported_families():
    """The family names daemon/metrics.cc gives prometheus-cpp, as string literals."""
    source = (ROOT / "daemon/metrics.cc").read_text()
    return set(re.findall(r'"((?:tpd|process)_[a-z0-9_]+)"', source))


class GrafanaDashboardTest(unittest.TestCase):
    def test_panels_have_ids_titles_and_queries(self):
        panels = dashboard()["panels"]
        self.assertGreaterEqual(len(panels), 8)
        self.assertEqual(len({p["id"] for p in panels}), len(panels), "panel ids are unique")
        for panel in panels:
            self.assertTrue(panel["title"])
            self.assertTrue(panel["targets"], panel["title"])

    def test_every_series_queried_is_exported(self):
        families = exported_families()
        self.assertIn("tpd_call_stage_seconds", families)
        for expr in queries():
            for name in re.findall(r"\b((?:tpd|process)_[a-z0-9_]+)", expr):
                family = name
                for suffix in HISTOGRAM_SUFFIXES:
                    if name.endswith(suffix) and name[: -len(suffix)] in families:
                        family = name[: -len(suffix)]
                self.assertIn(family, families, f"{expr} queries {name}, which tpd never exports")

    def test_every_query_is_promql(self):
        promtool = next((p for p in PROMTOOLS if os.access(p, os.X_OK)), None)
        if promtool is None:
            self.skipTest("promtool (Debian's prometheus package; tools/setup.sh unpacks it) "
                          "is not here: the queries' syntax is not checked")
        rules = ["groups:", "  - name: dashboard", "    rules:"]
        for i, expr in enumerate(queries()):
            expr = expr.replace("$__rate_interval", "5m").replace("$instance", ".*")
            rules += [f"      - record: dashboard:query{i}", f"        expr: {json.dumps(expr)}"]
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as file:
            file.write("\n".join(rules) + "\n")
            file.flush()
            check = subprocess.run([promtool, "check", "rules", file.name],
                                   capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)


if __name__ == "__main__":
    unittest.main()
