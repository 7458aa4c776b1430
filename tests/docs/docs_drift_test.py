"""Keeps the documents true to the programs: every spexd flag has a row in docs/spexd.md and every
row names a real flag with its real default; the spexctl table lists exactly the subcommands the
program has; every relative link of README.md and docs/ resolves (file and #anchor); no document
calls a piece "not written yet". Run by tests/docs/run_docs_drift_test.sh (one JUnit case per
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


def doc_flag_rows():
    """{flag: default cell} of the flag table of docs/spexd.md."""
    rows = {}
    for line in section(read("docs/spexd.md"), "Flags").splitlines():
        m = re.match(r"\| `--(\w+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


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
        flags, wrong = spexd_flags(), []
        for name, cell in doc_flag_rows().items():
            m = re.match(r"`([^`]*)`", cell)
            if m is None or name not in flags:
                continue
            if m.group(1) != flags[name]:
                wrong.append(f"--{name}: docs `{m.group(1)}`, spexd {flags[name]!r}")
        self.assertEqual(wrong, [])


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


class NothingCalledUnwritten(unittest.TestCase):
    def test_no_not_written_yet(self):
        hits = []
        for doc in documents() + ["client/python/README.md"]:
            for n, line in enumerate(read(doc).splitlines(), 1):
                # Quoting the phrase ("not written yet") talks about it; anything else uses it.
                if re.search(r"not written yet", re.sub(r"\"[^\"]*\"", "", line), re.I):
                    hits.append(f"{doc}:{n}: {line.strip()}")
        self.assertEqual(hits, [], "say what is missing under the README's Limitations instead")


if __name__ == "__main__":
    unittest.main()
