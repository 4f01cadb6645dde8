"""The documentation: ``mkdocs build --strict`` passes, links resolve, sources cited by title.

``--strict`` turns every MkDocs warning into a failure: a link to a page or anchor that does not
exist, an API block (``::: lightning_losses.xxx``) whose object cannot be found, a docstring
section the parser cannot read. The file checks below also cover README.md, which MkDocs does not
build: every relative link in it and in ``docs/`` names a file of the repository, and no page
points outside it or cites a source by an internal file number instead of its author and title.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and [text](target "t")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def mkdocs_executable() -> str | None:
    """The ``mkdocs`` beside this interpreter (the project's venv), else one on ``PATH``."""
    beside = Path(sys.executable).with_name("mkdocs")
    return str(beside) if beside.exists() else shutil.which("mkdocs")


def relative_links(page: Path) -> list[str]:
    """The link targets of ``page`` outside code blocks that are paths (no scheme, no ``#``)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]


def test_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    for page in ("README.md", "docs/index.md", "docs/losses.md", "docs/api/functional.md"):
        assert page in names


@pytest.mark.skipif(
    mkdocs_executable() is None,
    reason="mkdocs is not installed (it comes with the dev extra: pip install -e '.[dev]')",
)
@pytest.mark.slow
def test_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [mkdocs_executable(), "build", "--strict", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    api = (tmp_path / "site" / "api" / "functional" / "index.html").read_text(encoding="utf-8")
    assert 'id="lightning_losses.functional.focal_loss"' in api  # the API page was generated
    callbacks = (tmp_path / "site" / "api" / "callbacks" / "index.html").read_text("utf-8")
    assert "GammaAnnealing" in callbacks
    # The home page is the README's text (docs/readme_page.py), its links to the site's pages.
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Which loss should I start with" in home
    assert 'href="reproduce/#the-committed-report-which-code-made-which-numbers"' in home
    check_api_cross_references(tmp_path / "site")


def check_api_cross_references(site: Path) -> None:
    """The API pages show no Sphinx role as text: each became a link or, unresolved, a code span.

    The docstrings name objects with Sphinx roles (``:class:`~lightning_losses.AdaFocalLoss```);
    the Griffe extension ``docs/griffe_sphinx_roles.py`` rewrites them into cross-references.
    """
    html = sorted(site.glob("api/**/*.html"))
    pages = {p.relative_to(site).as_posix(): p.read_text("utf-8") for p in html}
    for name, page in pages.items():
        raw = re.findall(r":(?:class|func|meth|mod|data|attr|obj|exc):", page)
        assert not raw, f"{name}: {len(raw)} Sphinx roles shown as text"
    api = "".join(pages.values())
    # ``:class:`~lightning_losses.AdaFocalLoss``` (``~``: the last component) is a link to the
    # class on the losses page, from other pages too.
    to_class = r'<a class="autorefs autorefs-internal"[^>]*href="(?:(?:\.\./)?losses/)?#{}"[^>]*>'
    link = to_class.format(re.escape("lightning_losses.AdaFocalLoss")) + "<code>AdaFocalLoss</code>"
    assert re.search(link, api), "no link to AdaFocalLoss in the API pages"
    assert api.count('class="autorefs autorefs-internal"') >= 100  # about 180 roles resolve
    # A target no page renders (torch's own functions) stays a code span, and the build passed.
    assert '<span title="torch.nn.functional.cross_entropy"><code>' in api
    # The API index names its main entry points as links into the pages.
    index = pages["api/index.html"]
    assert re.search(to_class.format(re.escape("lightning_losses.FocalLoss")), index)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_files(page: Path) -> None:
    missing = []
    for target in relative_links(page):
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            missing.append(target)
        elif ROOT not in resolved.parents and resolved != ROOT:
            missing.append(f"{target} (outside the repository)")
    assert not missing, f"{page.relative_to(ROOT)}: broken links {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_internal_references(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for pattern in (r"\.\./shared", r"\bseeds/", r"\bseed 0\d\d\b", r"\bseed_0\d\d\b"):
        found = re.search(pattern, text, flags=re.IGNORECASE)
        assert found is None, f"{page.relative_to(ROOT)}: {found.group(0)!r} (cite by title)"


def test_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    text = "[ok](page.md) [web](https://example.org) [gone](nope.md#x) [a](#b)\n```\n[x](y)\n```\n"
    page.write_text(text)
    assert relative_links(page) == ["page.md", "nope.md#x"]
