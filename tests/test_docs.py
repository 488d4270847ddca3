"""The documentation holds together: README.md is a map whose links reach every page of
docs/, every relative link and anchor in README.md and docs/*.md resolves the way GitHub
renders them, each long page opens with a Contents list of its sections, and the quick
start names files that exist."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO
from tests.docs_commands import FENCE, pages

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
CONTENTS = "**Contents**"
# a page with this many sections (##) opens with a Contents list
LONG_PAGE_SECTIONS = 3


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, inline code spans blanked out."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: link targets and markup dropped, lower case,
    punctuation other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        found = None if fenced else re.match(r"(#{1,6}) (.*?)\s*#*\s*$", line)
        if found:
            out.append((len(found.group(1)), found.group(2)))
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a heading of the page defines (repeats get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for _, heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(repo: str = REPO) -> list[str]:
    """'page: target (why)' for each relative link that does not resolve."""
    broken = []
    for page in pages(repo):
        with open(page) as fh:
            text = fh.read()
        for target in (m.group(1) for line in prose(text) for m in LINK.finditer(line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            name = f"{os.path.relpath(page, repo)}: {target}"
            if not os.path.realpath(dest).startswith(os.path.realpath(repo) + os.sep):
                broken.append(f"{name} (outside the repository)")
            elif not os.path.exists(dest):
                broken.append(f"{name} (no such file)")
            elif fragment:
                if not dest.endswith(".md"):
                    broken.append(f"{name} (an anchor into a file that is not markdown)")
                    continue
                with open(dest) as fh:
                    if fragment not in anchors(fh.read()):
                        broken.append(f"{name} (no heading #{fragment})")
    return broken


def test_every_relative_link_and_anchor_resolves():
    assert broken_links() == []


def test_the_checker_finds_a_missing_file_a_missing_anchor_and_an_escape(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n## Keeping `/var/run/cdi` current\n\n"
        "[ok](docs/a.md#environment-the-gpu-operators-toolkit-variables) "
        "[self](#keeping-varruncdi-current) [gone](docs/gone.md) [web](https://example.com)\n"
        "`[in code](docs/gone.md)`\n```\n[in a block](docs/gone.md)\n```\n"
    )
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n\n## Environment (the GPU Operator's toolkit variables)\n\n"
        "[up](../README.md#top) [no anchor](../README.md#nowhere) [out](../../etc/passwd)\n"
    )
    assert broken_links(str(tmp_path)) == [
        "README.md: docs/gone.md (no such file)",
        "docs/a.md: ../README.md#nowhere (no heading #nowhere)",
        "docs/a.md: ../../etc/passwd (outside the repository)",
    ]


def test_github_anchors_of_repeated_and_marked_up_headings():
    text = (
        "# nvshim\n## `nvshim node`\n## Sharing config (`/etc/nvshim/sharing.yaml`)\n"
        "## Logs\n## Logs\n"
    )
    assert anchors(text) == {
        "nvshim",
        "nvshim-node",
        "sharing-config-etcnvshimsharingyaml",
        "logs",
        "logs-1",
    }


def test_the_readme_links_every_page_of_docs():
    with open(os.path.join(REPO, "README.md")) as fh:
        linked = {
            os.path.normpath(m.group(1).partition("#")[0])
            for line in prose(fh.read())
            for m in LINK.finditer(line)
        }
    on_disk = {os.path.relpath(p, REPO) for p in pages()[1:]}
    assert on_disk and on_disk <= linked, sorted(on_disk - linked)


@pytest.mark.parametrize("page", pages()[1:], ids=os.path.basename)
def test_each_page_has_one_title_and_long_pages_open_with_their_contents(page):
    with open(page) as fh:
        text = fh.read()
    found = headings(text)
    assert [level for level, _ in found].count(1) == 1 and found[0][0] == 1, found[:3]
    sections = [slug(heading) for level, heading in found if level == 2]
    if len(sections) < LONG_PAGE_SECTIONS:
        return
    lines = prose(text)
    assert CONTENTS in lines, f"{page}: {len(sections)} sections and no {CONTENTS}"
    start = lines.index(CONTENTS) + 2
    block = lines[start : lines.index("", start)]
    first = next(heading for level, heading in found if level == 2)
    assert lines.index(CONTENTS) < text.splitlines().index(f"## {first}")
    assert [re.search(r"\]\(#([^)]+)\)", x).group(1) for x in block] == sections


def test_the_quick_start_runs_files_of_this_checkout():
    with open(os.path.join(REPO, "README.md")) as fh:
        quick = fh.read().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S).group(1)
    scripts = re.findall(r"^bash (\S+)", block, re.M)
    assert scripts == ["tests/demo.sh", "tests/run.sh"]
    assert all(os.path.isfile(os.path.join(REPO, s)) for s in scripts)
