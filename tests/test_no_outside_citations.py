"""The project documents itself: no tracked file sends a reader to a document a clone does not have.

A clone holds the code, the tests and ``docs/``. Notes kept beside the checkout (a scenario
catalogue, a design card, reference pages, numbered seed texts, an issue tracker) are not in it, so
a comment, docstring or page that says "see SCENARIOS.md", "autoscalers.md §1.7", "seed 002" or
"issue 11 §3" leaves its reader with nothing to open. Each such fact lives in ``docs/`` (the
decision contract in docs/contract.md, replay in docs/replay.md, Curio in docs/curio.md, money in
docs/money.md, …) or is said in a sentence where it is used. Curio's own source files
(``tasks/seal/poller.go``) and vast.ai's documentation are public sources and may be named.

The one exception is CI: ``.ci/run`` replays a shared folder of scenario cases when one sits
beside the checkout; the lines that do that (not its comments) are allowed below.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (what it is, the pattern) — every pattern is matched case-insensitively
OUTSIDE = [
    ("the scenario catalogue", r"\bSCENARIOS\.md\b"),
    ("the design card", r"\bDESIGN\.md\b"),
    ("a reference page",
     r"\b(?:agent-runtimes|autoscalers|console-ux|gpu-faults|style|vastai)\.md\b|(?<![\w/])curio\.md\b"
     r"|\breference/[\w-]+\.md\b"),
    ("the shared folder", r"\.\./shared\b|\bshared/(?:cases|seeds|reference|hooks)\b"),
    ("a seed by its number or file", r"\bseeds? 0\d\d\b|\bseeds/|\b0\d\d_[0-9a-f]{16}\b"),
    ("an issue by its number", r"\bissues? #?\d+\b"),
    ("a section of an outside document", r"§|\\u00a7"),
]
PATTERN = re.compile("|".join(f"(?:{p})" for _, p in OUTSIDE), re.IGNORECASE)

#: the folder beside the checkout, spelled apart so this file does not name it
#: (tests/test_replay_cases.py checks that no test reads beside the project)
SHARED = "../" + "shared"

#: .ci/run may run the shared cases (CI's own use of the folder, not a citation): these code lines
ALLOWED = {
    ".ci/run": {
        f'if [ -d "$ROOT/{SHARED}/cases" ]; then',
        f'log "replay {SHARED}/cases"',
        f'for case in "$ROOT"/{SHARED}/cases/*.json; do',
    },
}

#: binary and vendored files a person does not read as prose
SKIP_SUFFIXES = {".png", ".jpg", ".ico", ".woff", ".woff2", ".gz", ".min.js", ".LICENSE", ".lock"}
SKIP_FILES = {"package-lock.json", "tests/test_no_outside_citations.py"}


def tracked_files() -> list[str]:
    """Every file git tracks, plus new files not ignored (what a clone or the next commit holds)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted({line for line in out.splitlines() if line and (ROOT / line).is_file()})


def citations(path: str, text: str) -> list[str]:
    """``path:line: text`` for each line of ``text`` that names an outside document, minus the allowed."""
    allowed = ALLOWED.get(path, set())
    here = (ROOT / path).parent
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip() in allowed:
            continue
        # a page of our own linked by its relative name (docs/operations.md's ``curio.md``) is ours
        found = [m.group() for m in PATTERN.finditer(line) if not (here / m.group()).is_file()]
        if found:
            hits.append(f"{path}:{n}: {line.strip()[:400]}")
    return hits


def test_no_tracked_file_cites_a_document_outside_the_repository():
    hits = []
    for path in tracked_files():
        if path in SKIP_FILES or any(path.endswith(s) for s in SKIP_SUFFIXES) or path.startswith(("static/vendor/", "tests/vendor/")):
            continue
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += citations(path, text)
    assert not hits, ("these lines send the reader outside the repository; cite docs/… or state the idea:\n"
                      + "\n".join(hits))


def test_the_scanner_catches_each_kind_and_passes_the_project_own_names():
    """Near misses both ways: every kind of outside citation is caught; docs/curio.md, Curio's source
    files, the scenario files named after seeds and CI's replay line are not."""
    caught = ["see SCENARIOS.md", "DESIGN.md invariant 10", "autoscalers.md rule 2", "reference/curio.md",
              "per curio.md", f"{SHARED}/cases", "seed 002", "Seed 000's layers", "seeds/001_bd6cada6919985fe.txt",
              "issue 11", "Issue #7", "gpu-faults.md §4"]
    for line in caught:
        assert citations("x.py", line), line
    assert not citations("docs/operations.md", "the demand source is [curio.md](curio.md)")
    assert citations("docs/operations.md", "see [vastai.md](vastai.md)")
    passed = ["docs/curio.md", "Curio's tasks/seal/poller.go", "tests/scenarios/seed002-all-workers-dead.json",
              "vast.ai's instance docs", "an issue of the model's answer", "see docs/contract.md#refusal-order"]
    for line in passed:
        assert not citations("x.py", line), line
    assert not citations(".ci/run", f'    log "replay {SHARED}/cases"')
    assert citations(".ci/run", f"# the rules are in {SHARED}/DESIGN.md")
