"""Keeps the documents true to the programs: every spexd flag has a row in docs/spexd.md and every
row names a real flag with its real default, and so does every row of the README's flag table; the
spexctl table lists exactly the subcommands the program has; every status code daemon/ (or
kernels/, whose statuses it passes on) returns has a row in docs/errors.md, and every row names one
it returns; docs/design.md's RPC table is exactly the service of proto/spex.proto, and its engine
table names exactly the files of daemon/engine; every relative link of README.md and docs/
resolves (file and #anchor); no document calls a piece "not written yet" or cites an issue number
(the repository has no issue tracker: say what is meant). Everything compared is read from the
code as built or its sources, so a flag, status code, RPC or engine file added later fails this
test until the documents say so. Run by tests/docs/run_docs_drift_test.sh (one JUnit case per
test method, counted by tests/run.sh)."""

import glob
import os
import re
import subprocess
import unittest

RUNFILES = os.path.join(os.environ.get("RUNFILES_DIR") or os.environ.get("TEST_SRCDIR", "."), "spex")
SPEXD = os.path.join(RUNFILES, "daemon", "spexd")
SPEXCTL = os.path.join(RUNFILES, "client", "spexctl")
# Files outside the runfiles (a link to any file of the repository) are looked up in the source
# tree the README's runfiles link points into.
SOURCE = os.path.dirname(os.path.realpath(os.path.join(RUNFILES, "README.md")))


def read(rel):
    with open(os.path.join(RUNFILES, rel), encoding="utf-8") as f:
        return f.read()


def documents():
    """README.md and every Markdown file under docs/, as workspace-relative paths."""
    docs = sorted(os.path.relpath(p, RUNFILES) for p in glob.glob(os.path.join(RUNFILES, "docs", "**", "*.md"),
                                                                  recursive=True))
    return ["README.md"] + docs


def all_documents():
    """Every Markdown file in the runfiles (README.md, docs/, client/python/README.md,
    kernels/cuda/README.md, ...), as workspace-relative paths."""
    found = set()
    for p in glob.glob(os.path.join(RUNFILES, "**", "*.md"), recursive=True):
        rel = os.path.relpath(p, RUNFILES)
        if not rel.startswith(("external", "..", "_")):
            found.add(rel)
    return sorted(found)


def sources(*folders):
    """{workspace-relative path: text} of the .h/.cc files under `folders` in the runfiles."""
    out = {}
    for folder in folders:
        for ext in ("h", "cc"):
            for p in glob.glob(os.path.join(RUNFILES, folder, "**", f"*.{ext}"), recursive=True):
                with open(p, encoding="utf-8") as f:
                    out[os.path.relpath(p, RUNFILES)] = f.read()
    return out


def section(text, heading):
    """The body of the `## heading` section (up to the next level-2 heading)."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m is None:
        raise AssertionError(f"no '## {heading}' section")
    return m.group(1)


def without_code(text):
    """The text with fenced blocks and inline code spans blanked (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def spexd_flags():
    """{flag: default} for the flags spexd's own sources define (absl's own are left out)."""
    p = subprocess.run([SPEXD, "--helpfull"], capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    flags, source, last = {}, None, None
    for line in out.splitlines():
        m = re.match(r"\s+Flags from (\S+):$", line)
        if m:
            source = m.group(1)
            continue
        own = source is not None and "absl/" not in source
        m = re.match(r"    --(\w+) \(", line)
        if m and own:
            last = m.group(1)
            flags[last] = None
        m = re.search(r"default: (.*);$", line)
        if m and own and last is not None and flags[last] is None:
            flags[last] = m.group(1).strip('"')
    return flags


def flag_rows(text):
    """{flag: default cell} of the rows `| `--flag` | default | ... |` of a flag table."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `--(\w+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def doc_flag_rows():
    """{flag: default cell} of the flag table of docs/spexd.md."""
    return flag_rows(section(read("docs/spexd.md"), "Flags"))


def readme_flag_rows():
    """{flag: default cell} of the README's table of the flags people change."""
    return flag_rows(section(read("README.md"), "Configuration"))


def wrong_defaults(rows, flags, where):
    """Rows whose default cell starts with a `value` other than spexd's default (cells that
    describe a computed default in words are not compared)."""
    wrong = []
    for name, cell in rows.items():
        m = re.match(r"`([^`]*)`", cell)
        if m is None or name not in flags:
            continue
        if m.group(1) != flags[name]:
            wrong.append(f"{where} --{name}: docs `{m.group(1)}`, spexd {flags[name]!r}")
    return wrong


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    found, seen = set(), {}
    body = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6} (.+?)\s*#*$", body, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    found.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return found


def locate(rel):
    """The file of a workspace-relative path: in the runfiles, else in the source tree."""
    for root in (RUNFILES, SOURCE):
        path = os.path.normpath(os.path.join(root, rel))
        if os.path.exists(path):
            return path
    return None


class SpexdFlags(unittest.TestCase):
    def test_helpfull_lists_flags(self):
        flags = spexd_flags()
        # A parse that found nothing would make the comparisons below pass vacuously.
        self.assertGreater(len(flags), 40, "spexd --helpfull listed too few of its own flags")
        self.assertIn("local_trainers", flags)

    def test_every_flag_documented(self):
        missing = sorted(set(spexd_flags()) - set(doc_flag_rows()))
        self.assertEqual(missing, [], "spexd flags without a row in docs/spexd.md's flag table "
                         "(add `| `--NAME` | `DEFAULT` | what it does |`)")

    def test_every_documented_flag_exists(self):
        extra = sorted(set(doc_flag_rows()) - set(spexd_flags()))
        self.assertEqual(extra, [], "rows of docs/spexd.md's flag table that spexd does not have")

    def test_documented_defaults(self):
        """A default cell that starts with a `value` must be spexd's default as --helpfull prints it
        (cells that describe a computed default in words are not compared)."""
        self.assertEqual(wrong_defaults(doc_flag_rows(), spexd_flags(), "docs/spexd.md"), [])


class ReadmeFlags(unittest.TestCase):
    """The README's short flag table is held to the same rules as docs/spexd.md's full one."""

    def test_table_found(self):
        self.assertGreater(len(readme_flag_rows()), 5, "found too few rows in the README's flag table")

    def test_every_readme_flag_exists(self):
        extra = sorted(set(readme_flag_rows()) - set(spexd_flags()))
        self.assertEqual(extra, [], "rows of the README's flag table (## Configuration) that spexd does not have")

    def test_readme_defaults(self):
        self.assertEqual(wrong_defaults(readme_flag_rows(), spexd_flags(), "README.md"), [])

    def test_defaults_in_words_only_where_spexd_md_uses_words(self):
        """A README default given in words (`off`, `every usable GPU`) hides a value unless
        docs/spexd.md, checked against spexd, also describes that default in words."""
        full, hidden = doc_flag_rows(), []
        for name, cell in readme_flag_rows().items():
            if not cell.startswith("`") and full.get(name, "").startswith("`"):
                hidden.append(f"--{name}: README {cell!r}, docs/spexd.md {full[name]!r}")
        self.assertEqual(hidden, [], "give the README's default as spexd.md does")


def spexctl(*args):
    return subprocess.run([SPEXCTL, *args], capture_output=True, text=True, timeout=30)


def program_subcommands():
    """The subcommands of spexctl's usage line: 'usage: spexctl [--x] ... a | b [--y] | c D'."""
    usage = spexctl().stderr
    m = re.search(r"usage: spexctl((?: \[[^\]]*\])*) (.*)", usage)
    if m is None:
        raise AssertionError(f"spexctl printed no usage line: {usage!r}")
    return {alt.split()[0] for alt in m.group(2).split(" | ")}


def doc_subcommands():
    """The invocations of the spexctl table of docs/spexd.md: ['health', 'set-density D', ...]."""
    calls = []
    for line in section(read("docs/spexd.md"), "spexctl").splitlines():
        if re.match(r"\| `", line):
            first_cell = line.split("|")[1]
            calls += re.findall(r"`([^`]+)`", first_cell)
    return calls


class SpexctlSubcommands(unittest.TestCase):
    def test_usage_lists_subcommands(self):
        self.assertIn("health", program_subcommands())

    def test_table_matches_program(self):
        documented = {c.split()[0] for c in doc_subcommands()}
        self.assertEqual(documented, program_subcommands(),
                         "docs/spexd.md's spexctl table and `spexctl`'s usage differ")

    def test_program_accepts_documented_calls(self):
        """spexctl exits 2 with its usage for an unknown subcommand or argument count; every
        documented call must get further (to the missing daemon: exit 1, or 0 for watch)."""
        bogus = spexctl("--socket=/nonexistent/spex.sock", "no-such-subcommand")
        self.assertEqual(bogus.returncode, 2, bogus.stderr)
        for call in doc_subcommands():
            words = re.sub(r"\[[^\]]*\]", "", call).split()
            args = [{"D": "0.5", "PATH": "timeline.json", "N": "1"}.get(w, w) for w in words]
            if args[0] == "watch":
                args.append("--count=1")
            p = spexctl("--socket=/nonexistent/spex.sock", "--timeout_ms=200", *args)
            self.assertNotEqual(p.returncode, 2, f"spexctl {' '.join(args)}: {p.stderr}")


class Links(unittest.TestCase):
    def test_relative_links_resolve(self):
        broken, checked = [], 0
        for doc in documents():
            text = without_code(read(doc))
            for target in re.findall(r"\]\(([^)\s]+)\)", text):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                    continue
                checked += 1
                path, _, anchor = target.partition("#")
                rel = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                found = locate(rel)
                if found is None:
                    broken.append(f"{doc}: {target} (no file {rel})")
                elif anchor and found.endswith(".md"):
                    with open(found, encoding="utf-8") as f:
                        if anchor not in anchors(f.read()):
                            broken.append(f"{doc}: {target} (no heading or <a id> '{anchor}' in {rel})")
        self.assertGreater(checked, 20, "found too few links: the link parser is broken")
        self.assertEqual(broken, [])

    def test_slug_rule(self):
        self.assertEqual(slug("Install (offline, Debian's Python)"), "install-offline-debians-python")
        self.assertEqual(slug("spexrun: the launcher"), "spexrun-the-launcher")


def without_comments(code):
    """C++ source with its // and /* */ comments blanked (a code named in a comment is not returned)."""
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    return re.sub(r"//[^\n]*", "", code)


def snake(camel):
    """InvalidArgument -> INVALID_ARGUMENT."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


def returned_codes():
    """{CODE: first file naming it} of the status codes the daemon's sources (and the kernels',
    whose statuses it passes on) construct or name: absl::XError(...), absl::StatusCode::kX,
    grpc::StatusCode::X. OK is not an error and is left out."""
    codes = {}
    for path, text in sorted(sources("daemon", "kernels").items()):
        code = without_comments(text)
        found = [snake(m) for m in re.findall(r"\babsl::(\w+?)Error\(", code)]
        found += [snake(m) for m in re.findall(r"\bStatusCode::k(\w+)", code)]
        found += re.findall(r"\bgrpc::StatusCode::([A-Z_]+)", code)
        for c in found:
            if c != "OK":
                codes.setdefault(c, path)
    return codes


def error_rows():
    """The codes of docs/errors.md's table (`| `CODE` | meaning |`)."""
    return set(re.findall(r"^\| `([A-Z_]+)` \|", read("docs/errors.md"), re.M))


GRPC_CODES = {"CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
              "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
              "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}


class StatusCodes(unittest.TestCase):
    def test_sources_found(self):
        # A parse that found nothing would make the comparisons below pass vacuously.
        codes = returned_codes()
        self.assertGreater(len(sources("daemon")), 50, "found too few daemon sources in the runfiles")
        self.assertIn("INVALID_ARGUMENT", codes)
        self.assertTrue(set(codes) <= GRPC_CODES, f"not gRPC codes: {sorted(set(codes) - GRPC_CODES)}")

    def test_every_returned_code_has_a_row(self):
        codes = returned_codes()
        missing = sorted(f"{c} (e.g. {codes[c]})" for c in set(codes) - error_rows())
        self.assertEqual(missing, [], "status codes spexd returns without a row in docs/errors.md "
                         "(add `| `CODE` | what it means to a caller and what to do |`)")

    def test_every_row_is_returned(self):
        extra = sorted(error_rows() - set(returned_codes()))
        self.assertEqual(extra, [], "rows of docs/errors.md for codes nothing in daemon/ or kernels/ returns")


def proto_rpcs():
    """The RPCs of proto/spex.proto's services, in order."""
    text = re.sub(r"//[^\n]*", "", read("proto/spex.proto"))
    rpcs = []
    for body in re.findall(r"^service \w+ \{(.*?)^\}", text, re.S | re.M):
        rpcs += re.findall(r"\brpc (\w+)\s*\(", body)
    return rpcs


def table_rows(text, header):
    """The first cells of the table whose header row starts with `header` (e.g. '| RPC |')."""
    lines = [line.strip() for line in text.splitlines()]  # a table may be indented in a list item
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(row.split("|")[1].strip())
            return rows
    raise AssertionError(f"no table with the header {header!r}")


def design_rpcs():
    """The RPC names of docs/design.md's RPC table (`| `Name` | ... |`)."""
    return [name for cell in table_rows(read("docs/design.md"), "| RPC |") for name in re.findall(r"`(\w+)`", cell)]


class RpcTable(unittest.TestCase):
    def test_proto_parsed(self):
        self.assertIn("Exchange", proto_rpcs())

    def test_design_lists_the_protos_rpcs(self):
        self.assertEqual(sorted(design_rpcs()), sorted(proto_rpcs()),
                         "docs/design.md's RPC table (| RPC | ...) and proto/spex.proto's service differ")


def expand(name):
    """`engine.{h,cc}` -> ['engine.h', 'engine.cc']."""
    m = re.match(r"(.*)\{([^}]*)\}(.*)", name)
    if m is None:
        return [name]
    return [x for part in m.group(2).split(",") for x in expand(m.group(1) + part.strip() + m.group(3))]


def engine_files():
    """The .h/.cc files under daemon/engine, relative to it."""
    return {os.path.relpath(p, "daemon/engine") for p in sources("daemon/engine")}


def design_engine_files():
    """The files the first cells of docs/design.md's engine table (| file | holds |) name."""
    names = []
    for cell in table_rows(read("docs/design.md"), "| file | holds |"):
        for item in re.findall(r"`([^`]+)`", cell):
            names += expand(item)
    return names


class EngineTable(unittest.TestCase):
    def test_engine_sources_found(self):
        self.assertIn("engine.cc", engine_files())

    def test_every_engine_file_named(self):
        missing = sorted(engine_files() - set(design_engine_files()))
        self.assertEqual(missing, [], "files of daemon/engine without a row in docs/design.md's engine table "
                         "(| file | holds |)")

    def test_every_named_file_exists(self):
        extra = sorted(set(design_engine_files()) - engine_files())
        self.assertEqual(extra, [], "docs/design.md's engine table names files daemon/engine does not have")

    def test_expand(self):
        self.assertEqual(expand("engine.{h,cc}"), ["engine.h", "engine.cc"])
        self.assertEqual(expand("step.h"), ["step.h"])


ISSUE = re.compile(r"\bissues?\s*(?:#\s*)?\d+|\bissue\s+#", re.I)


class NoIssueNumbers(unittest.TestCase):
    """The repository has no issue tracker: a document says what it means, not which issue."""

    def test_documents_found(self):
        docs = all_documents()
        for doc in ("README.md", "docs/design.md", "client/python/README.md", "kernels/cuda/README.md"):
            self.assertIn(doc, docs)

    def test_pattern(self):
        for cited in ("issue 12", "Issue 33's goal", "issues 12 and 14", "issue #7", "item 4 of issue 33"):
            self.assertTrue(ISSUE.search(cited), cited)
        for fine in ("a known issue", "issues with 2 cores", "the issue's 35 minutes"):
            self.assertFalse(ISSUE.search(fine), fine)

    def test_no_issue_numbers(self):
        hits = []
        for doc in all_documents():
            for n, line in enumerate(read(doc).splitlines(), 1):
                if ISSUE.search(line):
                    hits.append(f"{doc}:{n}: {ISSUE.search(line).group(0)!r} in {line.strip()[:120]}")
        self.assertEqual(hits, [], "documents citing issue numbers (say what is meant instead)")

    def test_every_document_checked(self):
        """Every Markdown file of the source tree is in the runfiles, so the checks above see it
        (add a new document to this test's data in tests/docs/BUILD)."""
        checked, unseen = set(all_documents()), []
        for root, dirs, files in os.walk(SOURCE):
            rel_root = os.path.relpath(root, SOURCE)
            dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-", "_")) and d not in ("third_party", "build")
                       and not d.endswith(".egg-info")]
            for f in files:
                rel = os.path.normpath(os.path.join(rel_root, f))
                if f.endswith(".md") and rel not in checked:
                    unseen.append(rel)
        self.assertEqual(sorted(unseen), [], "documents this test does not see: add each to the data of "
                         "tests/docs/BUILD (a filegroup or exports_files of its package)")


class NothingCalledUnwritten(unittest.TestCase):
    def test_no_not_written_yet(self):
        hits = []
        for doc in all_documents():
            for n, line in enumerate(read(doc).splitlines(), 1):
                # Quoting the phrase ("not written yet") talks about it; anything else uses it.
                if re.search(r"not written yet", re.sub(r"\"[^\"]*\"", "", line), re.I):
                    hits.append(f"{doc}:{n}: {line.strip()}")
        self.assertEqual(hits, [], "say what is missing under the README's Limitations instead")


if __name__ == "__main__":
    unittest.main()
