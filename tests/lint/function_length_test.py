"""No function under daemon/ is over 100 lines (function_length.py), and the scanner behind that
check finds what it should: a planted long function, the lengths at the limit, and not the
braces of comments, literals, initializers and default arguments."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import function_length  # noqa: E402

LIMIT = 100


def repo_root():
    # Under bazel the runfiles tree holds tests/lint and daemon/ side by side; by hand, the checkout.
    return os.path.dirname(os.path.dirname(HERE))


def lengths(text):
    return [(f.name, f.line, f.lines) for f in function_length.functions(text)]


def function_of(lines_between, name="F", head="int {}(int total) {{"):
    """A function whose braces enclose `lines_between` lines: lines_between + 2 lines in all."""
    body = "".join(f"  total += {i};\n" for i in range(lines_between))
    return head.format(name) + "\n" + body + "}\n"


class Daemon(unittest.TestCase):
    def test_no_function_over_100_lines(self):
        root = repo_root()
        daemon = os.path.join(root, "daemon")
        files = function_length.source_files([daemon])
        self.assertGreater(len(files), 50, f"daemon/ sources not found under {root}")
        found = function_length.long_functions([daemon], LIMIT)
        report = "\n".join(
            f"{os.path.relpath(f.path, root)}:{f.line}: {f.name} is {f.lines} lines" for f in found
        )
        if found:
            self.fail(f"functions over {LIMIT} lines (split them into named stages):\n{report}")

    def test_scanner_sees_the_daemons_functions(self):
        # A scanner that found nothing would pass the check above: the daemon has hundreds.
        root = repo_root()
        found = []
        for path in function_length.source_files([os.path.join(root, "daemon")]):
            with open(path, encoding="utf-8") as f:
                found += function_length.functions(f.read(), path)
        self.assertGreater(len(found), 400)
        names = {f.name for f in found}
        for expected in ("LoadConfig", "ExchangeOkTopk", "Engine::Start", "main"):
            self.assertIn(expected, names)


class Planted(unittest.TestCase):
    def test_planted_long_functions_fail_the_check(self):
        planted = os.path.join(HERE, "testdata", "planted.cc")
        run = subprocess.run(
            [sys.executable, os.path.join(HERE, "function_length.py"), planted],
            capture_output=True,
            text=True,
        )
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertEqual(
            run.stdout.splitlines(),
            [
                f"{planted}:125: PlantedTooLong is 101 lines (limit 100)",
                f"{planted}:231: AlsoTooLong is 101 lines (limit 100)",
            ],
        )

    def test_clean_file_passes(self):
        run = subprocess.run(
            [sys.executable, os.path.join(HERE, "function_length.py"), "--max", "101",
             os.path.join(HERE, "testdata", "planted.cc")],
            capture_output=True,
            text=True,
        )
        self.assertEqual((run.returncode, run.stdout), (0, ""))


class Scanner(unittest.TestCase):
    def test_length_is_brace_line_to_brace_line(self):
        self.assertEqual(lengths(function_of(98)), [("F", 1, 100)])
        self.assertEqual(lengths(function_of(99)), [("F", 1, 101)])
        self.assertEqual(lengths("\n\nvoid G()\n{\n}\n"), [("G", 4, 2)])

    def test_braces_in_comments_and_literals_are_not_code(self):
        text = (
            "// {\n"
            "/* } { */\n"
            'const char* a = "}{\\"{";\n'
            "const char b = '{';\n"
            "const char c = '\\'';\n"
            'const char* d = R"x(}")}")x";\n'
            "const long e = 1'000'000;\n"
            "#define M(x) { x; \\\n  }\n"
            "int F() {\n  return '}';\n}\n"
        )
        self.assertEqual(lengths(text), [("F", 10, 3)])

    def test_scopes_classes_and_initializers(self):
        text = (
            'namespace a {\nnamespace {\nextern "C" {\n'
            "int t[] = {1, 2};\n"  # an initializer, not a function
            "struct S : B {\n"
            "  S(int x) : x_{x}, y_(Y{x}) {\n    x_ = 1;\n  }\n"
            "  int x_{0};\n"
            "  int y_ ABSL_GUARDED_BY(mu_){0};\n"
            "  int Get(std::vector<int> v = {}) const override { return x_; }\n"
            "  auto Tail() -> std::string {\n    return {};\n  }\n"
            "  bool operator==(const S& o) const { return x_ == o.x_; }\n"
            "};\n"
            "template <typename T>\nT Max(T a) {\n  return a;\n}\n"
            "}\n}  // namespace\n}  // namespace a\n"
        )
        self.assertEqual(
            lengths(text),
            [("S", 6, 3), ("Get", 11, 1), ("Tail", 12, 3), ("operator==", 15, 1), ("Max", 18, 3)],
        )

    def test_a_lambda_counts_toward_its_function(self):
        inner = function_of(60, head="  auto {} = [&](int total) {{").replace("\n}\n", "\n  };\n")
        text = "int Outer(int total) {\n" + inner + inner + "  return total;\n}\n"
        self.assertEqual(lengths(text), [("Outer", 1, 1 + 2 * 62 + 2)])

    def test_a_namespace_scope_lambda_is_a_function(self):
        text = "const auto kTwice = [](int x) {\n  return 2 * x;\n};\n"
        self.assertEqual(lengths(text), [("kTwice (lambda)", 1, 3)])


if __name__ == "__main__":
    unittest.main()
