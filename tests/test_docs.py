"""Every code block in ``README.md`` and ``docs/*.md`` runs, as written.

Each page's fenced blocks run in order in one fresh temporary directory, in a child process of their
own (one per page, so a page cannot change the state of the test process or of another page):
``python`` blocks in one shared namespace, ``sh``/``bash`` blocks with ``bash -e -o pipefail``, with
this interpreter's ``bin/`` (its ``python`` and ``tvm-lowprec``) first on ``PATH``. A failure names
the page and the block's first line, and Python tracebacks point at the Markdown file's own lines.

The one exemption: a block right after ``<!-- docs-test: ci -->`` holds commands that cannot run
inside the test suite (installing the package, running the whole suite); those must be exactly what
``.ci/run`` executes, which this file checks instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REQUIRED = ["architecture.md", "numerics.md", "targets.md", "tuning.md", "ptq.md"]
LANGUAGES = {"python": "python", "sh": "sh", "bash": "sh"}
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<what>[\w-]+)\s*-->\s*$")
FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
PAGE_TIMEOUT = 600  # seconds; the slowest page (tuning) takes about a minute on 2 cores


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the block's first code line
    lang: str  # the info string as written ("" when none)
    code: str
    marker: str | None  # "ci" for a block after <!-- docs-test: ci -->

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the docs-test marker right before each."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence = match.group("fence")
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        start, i = i + 1, i + 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and set(lines[i].strip()) == {fence[0]}):
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start}: code block is not closed")
        code = "\n".join(lines[start:i]) + "\n"
        blocks.append(Block(page, start + 1, match.group("info").lower(), code, marker and marker.group("what")))
        i += 1
    return blocks


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_pages_exist():
    docs = {p.name for p in PAGES if p.parent.name == "docs"}
    assert set(REQUIRED) <= docs, f"missing docs pages: {sorted(set(REQUIRED) - docs)}"
    assert {"README.md", "index.md"} & docs, "docs/ needs an index page (README.md or index.md)"


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_every_block_runs_or_is_run_by_ci(path):
    """No block escapes: each one is Python or shell, or marked as run by CI; markers are only 'ci'
    and each stands right before a block."""
    text = path.read_text().splitlines()
    for number, line in enumerate(text, 1):
        marker = MARKER.match(line)
        if marker is None:
            continue
        assert marker.group("what") == "ci", f"{path.name}:{number}: unknown marker {marker.group('what')!r}"
        following = next((t for t in text[number:] if t.strip()), "")
        assert FENCE.match(following), f"{path.name}:{number}: a docs-test marker must stand right before a code block"
    for block in blocks_of(path):
        assert block.marker == "ci" or block.lang in LANGUAGES, (
            f"{block.where}: a code block must be python or sh (run by tests/test_docs.py), or be marked "
            f"<!-- docs-test: ci --> and run by .ci/run; got {block.lang or 'no language'!r}")


def _commands(code: str) -> list[list[str]]:
    """Shell command lines as token lists (comments and blank lines dropped, quoting normalised)."""
    out = []
    for line in code.splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens:
            out.append(tokens)
    return out


def test_ci_blocks_are_exactly_what_ci_runs():
    """The README's install and test commands are not run here (they would install into, and run, this
    very suite): ``.ci/run`` must run them, in that order, and no other install or test command."""
    ci_blocks = [b for p in PAGES for b in blocks_of(p) if b.marker == "ci"]
    assert ci_blocks, "the README's install and test commands belong in a block marked <!-- docs-test: ci -->"
    shown = [cmd for b in ci_blocks for cmd in _commands(b.code)]
    ci = _commands((ROOT / ".ci" / "run").read_text())
    positions = []
    for cmd in shown:
        assert cmd in ci, f"the docs show `{shlex.join(cmd)}`, which .ci/run does not run"
        positions.append(ci.index(cmd))
    assert positions == sorted(positions), "the docs show the CI commands in another order than .ci/run runs them"
    for cmd in ci:
        if "pytest" in cmd or ("pip" in cmd and "install" in cmd):
            assert cmd in shown, f".ci/run runs `{shlex.join(cmd)}`, which no ci-marked docs block shows"


_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_relative_links_resolve(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for match in _LINK.finditer(text):
        target = match.group("target").split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        assert (path.parent / target).exists(), f"{path.name}: link to {target} does not resolve"


# The child process: runs one page's blocks in order; Python blocks share one namespace.
RUNNER = r"""
import json, subprocess, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for b in blocks:
    print(f"\n===== {b['page']}:{b['line']} ({b['lang']})", flush=True)
    if b["lang"] == "python":
        try:
            # padded so that tracebacks give the line numbers of the Markdown file
            exec(compile("\n" * (b["line"] - 1) + b["code"], b["file"], "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"\nFAILED: the python block at {b['page']}:{b['line']}", flush=True)
            sys.exit(1)
        sys.stdout.flush()
        sys.stderr.flush()
    else:
        rc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b["code"]]).returncode
        if rc:
            print(f"\nFAILED: the sh block at {b['page']}:{b['line']} (exit status {rc})", flush=True)
            sys.exit(1)
"""


def _kill_group(pgid: int) -> None:
    """End whatever the page left running (servers it started): its process group, which we made."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_page_runs(path, tmp_path):
    blocks = [b for b in blocks_of(path) if b.marker != "ci" and b.lang in LANGUAGES]  # others: the test above
    if not blocks:
        return
    spec = tmp_path.parent / f"{tmp_path.name}-blocks.json"
    spec.write_text(json.dumps([{**asdict(b), "lang": LANGUAGES[b.lang], "file": str(ROOT / b.page)} for b in blocks]))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    log = tmp_path.parent / f"{tmp_path.name}-output.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(spec)], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=PAGE_TIMEOUT)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)
            proc.wait()
    output = log.read_text()
    failed = re.findall(r"^FAILED: .*$", output, flags=re.M)
    where = (failed[-1] if failed else f"the page did not finish within {PAGE_TIMEOUT} s" if timed_out
             else f"the page's process died of signal {-proc.returncode}" if proc.returncode < 0 else "")
    assert proc.returncode == 0, f"{path.name}: {where}\n\n{output[-6000:]}"
