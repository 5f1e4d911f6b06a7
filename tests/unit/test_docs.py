"""The documentation stands on its own: the generated reference pages match the code, every document the code
cites exists, nothing cites a document outside the repository, links between pages resolve, and the README
stays a front page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACKED = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
TEXT = [REPO / f for f in TRACKED if f.endswith((".py", ".md", ".sh", ".yaml", ".toml", "Dockerfile"))
        or (f.startswith("hack/") and "." not in Path(f).name)]  # fmt: skip


def test_the_generated_reference_pages_match_the_code() -> None:
    done = subprocess.run([sys.executable, str(REPO / "hack" / "gen-reference"), "--check"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_nothing_cites_a_document_outside_the_repository() -> None:
    outside = re.compile(r"shared/(reference|ARCHITECTURE)|\.\./shared/")
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in TEXT
        if p.is_file()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert found == []


def test_every_cited_document_exists() -> None:
    cited = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md")
    missing = sorted({f"{p.relative_to(REPO)}: {m}" for p in TEXT if p.is_file()
                      for m in cited.findall(p.read_text(errors="replace")) if not (REPO / m).is_file()})  # fmt: skip
    assert missing == []


def test_links_between_pages_resolve() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in link.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "hack/demo" in readme  # the two commands
    assert "hack/test" in readme
