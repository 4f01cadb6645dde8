"""An MkDocs hook: the site's home page is README.md, its links rewritten for the site.

One text for both front pages: ``docs/index.md`` holds only a comment, and at build time its
content becomes README.md's, whose links are written from the repository's root
(``docs/cli.md``, ``CHANGELOG.md``). On the site a page of ``docs/`` is linked by its name
there (``cli.md``); a link to a file outside ``docs/`` (the changelog, the committed report)
keeps its text and loses its target, since the site does not publish that file. ``mkdocs build
--strict`` then checks every rewritten link and anchor as it checks the other pages.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"
#: ``[text](target)``, the text without nested brackets (the README's links have none).
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:|^#")


def _site_link(match: re.Match[str]) -> str:
    text, target = match.group(1), match.group(2)
    if _EXTERNAL.match(target):
        return match.group(0)
    if target.startswith("docs/"):
        return f"[{text}]({target.removeprefix('docs/')})"
    return text  # a file the site does not publish: its name stays, as text


def readme_for_site(markdown: str) -> str:
    r"""README.md's text with each link as the site needs it; code blocks unchanged.

    Example:
        >>> readme_for_site("[CLI](docs/cli.md#fit), [log](CHANGELOG.md), [x](https://x.org)")
        '[CLI](cli.md#fit), log, [x](https://x.org)'
        >>> readme_for_site("```bash\n[a](docs/b.md)\n```\n")
        '```bash\n[a](docs/b.md)\n```\n'
    """
    pieces, last = [], 0
    for fence in _FENCE.finditer(markdown):
        pieces.append(_LINK.sub(_site_link, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(_LINK.sub(_site_link, markdown[last:]))
    return "".join(pieces)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """The home page (``index.md``) gets README.md's text; every other page stays as written."""
    if page.file.src_uri != "index.md":
        return markdown
    return readme_for_site(README.read_text(encoding="utf-8"))
