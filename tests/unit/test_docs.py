"""The documentation stands on its own: the generated reference pages match the code, every document the code
cites exists, nothing cites a document outside the repository, links between pages resolve, and the README
stays a front page."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speculator_operator.api.crds import all_crds

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


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    out: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*#*$", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out |= {slug, *(f"{slug}-{n}" for n in range(1, 4) if slug in out)}
    return out


def _sections(page: Path) -> set[str]:
    """The numbered sections of a page (`## 3. Serving pods`, `### 3.2 First vLLM`): what a `§3.2` cites."""
    return {
        m.group(1) for line in page.read_text().splitlines() if (m := re.match(r"#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", line))
    }


def test_links_between_pages_resolve() -> None:
    """Every relative link in the README and docs/ leads to a file, and its #anchor to a heading of that page."""
    link = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target, anchor in link.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor} (no such heading)")
    assert broken == []


def test_every_cited_section_exists() -> None:
    """`docs/reference/vllm.md §3.2` in code and `[vllm.md](vllm.md) §1.2 and §3.2` in a page name numbered headings
    that exist."""
    cited = re.compile(
        r"(?:(?<![\w/.-])(docs/[\w./-]+\.md)|\]\(([\w./-]+\.md)\))\s*(§[\d.]+(?:\s*(?:and|,|-|–)\s*§[\d.]+)*)"
    )
    missing = []
    for p in TEXT:
        if not p.is_file():
            continue
        for in_repo, relative, sections in cited.findall(p.read_text(errors="replace")):
            target = REPO / in_repo if in_repo else p.parent / relative
            if not target.is_file():
                continue  # test_every_cited_document_exists names it
            for number in re.findall(r"§([\d.]*\d)", sections):
                if number not in _sections(target):
                    missing.append(f"{p.relative_to(REPO)}: {target.relative_to(REPO)} §{number}")
    assert missing == []


def _descriptions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            yield node["description"]
        for value in node.values():
            yield from _descriptions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _descriptions(value)


def test_crd_descriptions_point_into_docs_that_exist() -> None:
    """What `kubectl explain` shows cites pages that exist (and their sections), and no README section: the README
    is a front page that changes, the pages under docs/ are what a field's description may lean on."""
    cited = re.compile(r"docs/[\w./-]+\.md(?:#[\w-]+)?")
    bad = []
    for crd in all_crds().values():
        for text in _descriptions(crd["spec"]["versions"]):
            if "README" in text:
                bad.append(f"{crd['spec']['names']['kind']}: cites the README: {text[:80]}")
            for ref in cited.findall(text):
                path, _, anchor = ref.partition("#")
                if not (REPO / path).is_file() or (anchor and anchor not in _anchors(REPO / path)):
                    bad.append(f"{crd['spec']['names']['kind']}: {ref}")
    assert bad == []


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "hack/demo" in readme  # the two commands
    assert "hack/test" in readme
