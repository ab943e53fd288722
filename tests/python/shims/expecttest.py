"""A stand-in for the `expecttest` package, which torch's test utilities import and Debian does
not package: the base class they derive from. Expect-tests themselves (assertExpectedInline)
are not used by the RPC tests this project runs, so they fail loudly if called."""

import unittest

ACCEPT = False  # torch reads it: expect-tests are never re-recorded here


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (torch's name)
        raise NotImplementedError("expect-tests need the real expecttest package")
