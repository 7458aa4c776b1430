"""Runs the unittest cases of one module and writes JUnit XML (one <testcase> per test method,
with <failure>, <error> or <skipped>) to $XML_OUTPUT_FILE, where Bazel keeps it as the target's
test.xml; tests/run.sh counts those cases. Exit status 1 when any case failed."""

import importlib.util
import os
import sys
import time
import traceback
import unittest
import xml.etree.ElementTree as ET


class RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, detail=""):
        self.records.append((test, status, detail, time.monotonic() - self._start))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(test, unittest.suite._ErrorHolder):  # setUpClass/module errors
            self.records.append((test, "error", self._exc_info_to_string(err, test), 0.0))
        else:
            self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "unexpected success")


def write_xml(path, suite_name, records, elapsed):
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(records)),
                          failures=str(sum(r[1] == "failure" for r in records)),
                          errors=str(sum(r[1] == "error" for r in records)),
                          skipped=str(sum(r[1] == "skipped" for r in records)), time=f"{elapsed:.3f}")
    for test, status, detail, secs in records:
        test_id = test.id()
        classname, _, name = test_id.rpartition(".")
        case = ET.SubElement(suite, "testcase", classname=classname or suite_name, name=name or test_id,
                             time=f"{secs:.3f}")
        if status in ("failure", "error"):
            el = ET.SubElement(case, status, message=detail.strip().splitlines()[-1][:500] if detail else status)
            el.text = detail
        elif status == "skipped":
            ET.SubElement(case, "skipped", message=detail)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def main():
    path = sys.argv[1]
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    start = time.monotonic()
    try:
        spec.loader.exec_module(module)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    except Exception:  # an import error is one failing case, not a silent zero
        detail = traceback.format_exc()
        print(detail)
        holder = unittest.suite._ErrorHolder(f"{name}.import")
        records = [(holder, "error", detail, 0.0)]
        if os.environ.get("XML_OUTPUT_FILE"):
            write_xml(os.environ["XML_OUTPUT_FILE"], name, records, time.monotonic() - start)
        return 1
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult, stream=sys.stdout)
    result = runner.run(suite)
    if not result.records and not result.errors:
        print("no test cases ran")
        return 1
    if os.environ.get("XML_OUTPUT_FILE"):
        write_xml(os.environ["XML_OUTPUT_FILE"], name, result.records, time.monotonic() - start)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
