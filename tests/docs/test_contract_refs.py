"""docs/contract.md is the contract the code cites, and every citation lands on it.

The code, tests and docs cite the contract as ``SPEC §N`` (or a bare ``§N``);
both mean the section numbered N in docs/contract.md. These tests keep the
citations and the page in step: a citation of a section the page lacks, a gap
in its numbering, or a public name that no contract or API page mentions fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import jaren_jobs

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "contract.md"
API = REPO / "docs" / "api.md"

# where citations live: the folders the project ships or tests, and the README
CITING_DIRS = ("src", "tests", "docs", "bench", "examples", "tools")
CITING_FILES = ("README.md",)
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".sql"}

# "SPEC §12", "§7", "§N.M": a dotted number names a subsection, which needs its own heading
CITATION = re.compile(r"§\s*(?P<number>\d+(?:\.\d+)?)")
# "## §12 Queues, ..." (any heading level; the sections themselves are level 2)
HEADING = re.compile(r"^(?P<level>#{1,6})[ \t]+§(?P<number>\d+(?:\.\d+)?)[ \t]+\S", re.M)

SECTIONS = 17

# public names deliberately stated on neither page: each with its reason
UNSTATED_NAMES = {
    "__version__",  # the installed version string; no promise beyond PEP 396's habit
}


def citing_files() -> list[Path]:
    found = [REPO / name for name in CITING_FILES]
    for folder in CITING_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                found.append(path)
    return found


def contract_text() -> str:
    assert CONTRACT.is_file(), "docs/contract.md, the contract the code cites, is missing"
    return CONTRACT.read_text(encoding="utf-8")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, number) of every numbered heading, in page order."""
    return [(len(m.group("level")), m.group("number")) for m in HEADING.finditer(text)]


def citations() -> dict[str, list[str]]:
    """Every cited section number, with the places (file:line) that cite it."""
    cited: dict[str, list[str]] = {}
    for path in citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for match in CITATION.finditer(line):
                where = f"{path.relative_to(REPO)}:{lineno}"
                cited.setdefault(match.group("number"), []).append(where)
    return cited


def test_the_code_cites_the_contract() -> None:
    # the scan would pass vacuously if it found nothing; the code cites it ~160 times
    cited = citations()
    assert sum(len(places) for places in cited.values()) > 100, cited


def test_every_cited_section_is_a_heading_of_the_contract() -> None:
    numbers = {number for _, number in headings(contract_text())}
    missing = {n: places[:3] for n, places in citations().items() if n not in numbers}
    assert not missing, f"cited but not a heading of docs/contract.md: {missing}"


def test_the_contract_numbers_its_sections_1_to_17_without_gaps() -> None:
    top = [number for level, number in headings(contract_text()) if level == 2]
    assert top == [str(n) for n in range(1, SECTIONS + 1)], top


def test_the_contract_says_what_a_spec_citation_means() -> None:
    text = contract_text()
    opening = text[: text.index("## §1 ")]
    assert "SPEC §N" in opening, "the opening must say that 'SPEC §N' in the code means §N here"


def test_every_public_name_is_on_the_contract_or_the_api_page() -> None:
    pages = contract_text() + "\n" + API.read_text(encoding="utf-8")
    absent = [
        name
        for name in jaren_jobs.__all__
        if name not in UNSTATED_NAMES
        and re.search(rf"(?<![\w.]){re.escape(name)}\b", pages) is None
    ]
    assert not absent, f"public names on neither docs/contract.md nor docs/api.md: {absent}"


def test_the_exclusions_name_public_names() -> None:
    # an exclusion that outlives its name would hide nothing and mislead
    assert UNSTATED_NAMES.issubset(jaren_jobs.__all__)


def test_nothing_points_at_a_contract_outside_the_repository() -> None:
    # the contract ships as docs/contract.md; a path to a copy elsewhere rots
    outside = "SPEC" + ".md"  # spelled in two parts so this file does not match itself
    pointing = [
        str(path.relative_to(REPO))
        for path in citing_files()
        if outside in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert not pointing, pointing
