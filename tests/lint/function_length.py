"""Finds C++ function definitions longer than a limit (default 100 lines), so that no function
under daemon/ grows past what a reader can hold (docs/testing.md#function-length).

A scanner, not a compiler: it blanks comments, string and character literals (raw strings
included) and preprocessor lines, then matches braces. A `{` at namespace or class scope opens a
function body when the text before it (back to the previous `;`, `{` or `}`) ends in a
parameter list, optionally followed by qualifiers (`const`, `override`, `noexcept`, a trailing
return type, annotations such as `ABSL_LOCKS_EXCLUDED(mu_)`) or a constructor's member
initializers; `namespace`, `extern "C"`, `class`, `struct`, `union` and `enum` bodies are scopes
searched for functions; any other block there (a variable's brace initializer) is skipped.
Everything inside a function body, lambdas and local classes included, counts toward that
function. A function's length is the lines from the one holding its opening brace to the one
holding its closing brace, both included.

    python3 tests/lint/function_length.py [--max N] [PATH ...]   # default: daemon

prints `file:line: NAME is N lines (limit M)` for each function over the limit and exits 1 if
there is any.
"""

import argparse
import os
import re
import sys
from typing import List, NamedTuple

SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".hpp", ".cpp")


class Function(NamedTuple):
    path: str
    line: int  # the line of the opening brace (1-based)
    name: str
    lines: int  # opening brace's line to closing brace's line, inclusive


def blank_literals(text: str) -> str:
    """`text` with comments, string/character literals and preprocessor lines replaced by spaces
    (newlines kept, so positions and line numbers stay those of the source)."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a block comment may run past the line
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            j = n if end < 0 else end + 2
            blank(i, j)
            i = j
            continue
        if c == '"':
            # A raw string: R"delim( ... )delim", with an optional u8/u/U/L prefix before R.
            s = i
            while s > 0 and (text[s - 1].isalnum() or text[s - 1] == "_"):
                s -= 1
            if text[s:i] in ("R", "u8R", "uR", "UR", "LR"):
                open_paren = text.find("(", i + 1)
                delim = text[i + 1 : open_paren] if open_paren >= 0 else ""
                if open_paren >= 0 and len(delim) <= 16 and re.fullmatch(r'[^\s()\\"]*', delim):
                    end = text.find(")" + delim + '"', open_paren + 1)
                    j = n if end < 0 else end + len(delim) + 2
                    blank(i, j)
                    i = j
                    continue
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
            continue
        if c == "'":
            # A digit separator (1'000'000, 0xff'ff) when the token before it is a number.
            k = i - 1
            while k >= 0 and (text[k].isalnum() or text[k] in "_'."):
                k -= 1
            if k + 1 < i and text[k + 1].isdigit():
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
            continue
        i += 1
    return "".join(out)


_CLASS_KEY = re.compile(r"^(?:typedef\s+)?(?:class|struct|union|enum)\b")
_SCOPE_KEY = re.compile(r"\b(?:namespace|extern)\b")
# What may follow a function's parameter list before its body.
_QUALIFIERS = re.compile(
    r"(?:\s|const\b|volatile\b|override\b|final\b|mutable\b|noexcept\b|&&|&|"
    r"->\s*[\w:<>,\s*&]+|\[\[[^\]]*\]\]|\b[A-Z][A-Z0-9_]*\b(?:\s*\([^()]*\))?|\([^()]*\))*"
)
_NAME = re.compile(r"(operator\s*\(\s*\)|operator\s*[^\s\w(]+|operator\s+\w+|~?[A-Za-z_][\w:~]*)\s*\(")


def strip_template_prefix(head: str) -> str:
    """`head` without leading `template <...>` clauses."""
    while True:
        m = re.match(r"\s*template\s*<", head)
        if m is None:
            return head.strip()
        depth, j = 1, m.end()
        while j < len(head) and depth > 0:
            depth += {"<": 1, ">": -1}.get(head[j], 0)
            j += 1
        head = head[j:]


def close_paren(head: str, j: int) -> int:
    """The index after the `)` matching the `(` at head[j], or -1."""
    depth = 0
    for k in range(j, len(head)):
        if head[k] == "(":
            depth += 1
        elif head[k] == ")":
            depth -= 1
            if depth == 0:
                return k + 1
    return -1


def parameter_list_end(head: str) -> int:
    """Where the function's parameter list ends in `head` (the text before a `{`), or -1 when the
    head is not a function declarator: a top-level (...) after a name, followed only by
    qualifiers, or by a constructor's `:` initializer list."""
    for m in _NAME.finditer(head):
        if m.group(1) in ("if", "for", "while", "switch", "return", "sizeof", "decltype"):
            continue
        if re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]*", m.group(1)) and head[: m.start()].strip():
            continue  # an annotation after a declarator (`x_ ABSL_GUARDED_BY(mu_){...}`)
        end = close_paren(head, m.end() - 1)
        if end < 0:
            return -1
        rest = after_qualifiers(head[end:])
        if rest.strip() == "" or initializer_list(rest):
            return end
    return -1


def after_qualifiers(tail: str) -> str:
    """`tail` (what follows a parameter list) without its leading qualifiers."""
    return tail[_QUALIFIERS.match(tail).end() :]


def initializer_list(rest: str) -> bool:
    """Whether `rest` (after a parameter list and its qualifiers) is a constructor's member
    initializer list."""
    r = rest.lstrip()
    return r.startswith(":") and not r.startswith("::")


def classify(head: str) -> str:
    """'scope' (namespace, extern, class-like: search inside), 'function' or 'other' (skip)."""
    h = strip_template_prefix(head)
    # Access specifiers and labels before a declaration in a class body.
    h = re.sub(r"^(?:(?:public|private|protected)\s*:(?!:)\s*)+", "", h)
    if _SCOPE_KEY.search(h) and "(" not in h:
        return "scope"
    if h.startswith("extern") or re.match(r"^(?:inline\s+)?namespace\b", h):
        return "scope"
    if _CLASS_KEY.match(h) and not h.rstrip().endswith(")"):
        return "scope"
    if "=" in re.sub(r"operator\s*[^\s(]*", "", h.split("(")[0]):
        # `auto f = [](...) {` at namespace scope is a lambda: a function as well.
        if not re.search(r"=\s*\[[^\]]*\]\s*(?:\([^()]*\))?[\w\s]*$", h):
            return "other"
    if parameter_list_end(h) >= 0:
        return "function"
    if re.search(r"=\s*\[[^\]]*\]\s*(?:\([^()]*\))?[\w\s]*$", h):
        return "function"
    return "other"


def function_name(head: str) -> str:
    h = strip_template_prefix(head)
    h = re.sub(r"^(?:(?:public|private|protected)\s*:(?!:)\s*)+", "", h)
    lam = re.search(r"(\w+)\s*=\s*\[", h)
    if lam is not None and "(" not in h.split("=")[0]:
        return lam.group(1) + " (lambda)"
    m = _NAME.search(h)
    return re.sub(r"\s+", "", m.group(1)) if m else "(unnamed)"


def matching_brace(code: str, i: int) -> int:
    """The index of the `}` matching the `{` at code[i] (len(code) when unbalanced)."""
    depth = 0
    for k in range(i, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def functions(text: str, path: str = "") -> List[Function]:
    """Every function definition of `text` (outermost only: a lambda inside a function is part
    of it)."""
    code = blank_literals(text)
    found = []
    i, head_start = 0, 0
    n = len(code)
    while i < n:
        c = code[i]
        if c in ";}":
            i += 1
            head_start = i
            continue
        if c != "{":
            i += 1
            continue
        head = code[head_start:i]
        if head.count("(") > head.count(")"):
            # Inside a parameter list or an argument (a default `= {}`, `: a_(Bar{1})`): not a
            # block, and the head goes on.
            i = matching_brace(code, i) + 1
            continue
        kind = classify(head)
        if kind == "scope":
            i += 1
            head_start = i
            continue
        # A member's brace initializer inside a constructor's initializer list (`: a_{x}, b_(y)
        # {`): skipped, and the head goes on.
        h = strip_template_prefix(head)
        end = parameter_list_end(h)
        if kind == "function" and end >= 0:
            rest = after_qualifiers(h[end:])
            if initializer_list(rest) and re.search(r"[\w>]\s*$", rest):
                i = matching_brace(code, i) + 1
                continue
        close = matching_brace(code, i)
        if kind == "function":
            first = code.count("\n", 0, i) + 1
            last = code.count("\n", 0, close) + 1
            found.append(Function(path, first, function_name(head), last - first + 1))
        i = close + 1
        head_start = i
    return found


def source_files(paths: List[str]) -> List[str]:
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs.sort()
                files += [os.path.join(root, f) for f in sorted(names) if f.endswith(SUFFIXES)]
        else:
            files.append(p)
    return files


def long_functions(paths: List[str], limit: int = 100) -> List[Function]:
    out = []
    for f in source_files(paths):
        with open(f, encoding="utf-8", errors="replace") as fh:
            out += [fn for fn in functions(fh.read(), f) if fn.lines > limit]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=100, help="longest allowed function, in lines")
    ap.add_argument("paths", nargs="*", default=["daemon"], help="files or folders (default: daemon)")
    args = ap.parse_args(argv)
    found = long_functions(args.paths, args.max)
    for fn in found:
        print(f"{fn.path}:{fn.line}: {fn.name} is {fn.lines} lines (limit {args.max})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
