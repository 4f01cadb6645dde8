"""What a newcomer reads and runs first: the README, the docs' home page, ``make demo``.

- ``make demo`` installs torch and the package, no test tool: ``make -n`` prints the whole
  recipe chain (with ``VENV`` pointing at a folder that does not exist, so that the venv's own
  recipe is printed too) and none of it names pytest, ruff, mypy, MkDocs, hypothesis,
  dirichletcal or the dev extra; ``make test`` after it still installs them.
- The README's first 40 lines say what the library is, give the two make commands and open
  "Which loss should I start with"; they name no commit (the provenance is on the Evidence page).
- The docs' home page is the README's text (one source, through the MkDocs hook
  ``docs/readme_page.py``), its links rewritten to pages of the site.
- Each count a page states ("36 shipped configs", "ten shipped configs" of the demo, "nine
  claims", ...) equals the count it names, computed here from the repository.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.paths import CONFIGS, DOCS, ROOT

README = ROOT / "README.md"
#: What only the tests, the lint and the docs need: none of it may be installed by the demo.
TEST_TOOLS = ("pytest", "ruff", "mypy", "mkdocs", "hypothesis", "dirichletcal", ".[dev]")
#: Number words as the pages write them.
WORDS = {
    w: n
    for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}
NUMBER = r"(\d+|" + "|".join(WORDS) + r")"

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no `make` on this machine")


def make_dry_run(target: str, venv: Path) -> str:
    """The commands ``make -n <target>`` would run, with ``VENV`` set to ``venv``.

    ``venv`` is written ``$VENV`` in them (a temporary folder's name may hold "pytest").
    """
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.replace(str(venv), "$VENV")


# --- make demo ---------------------------------------------------------------------------------


@needs_make
def test_make_demo_installs_no_test_tool(tmp_path: Path) -> None:
    commands = make_dry_run("demo", tmp_path / "no-venv-here")
    lines = commands.splitlines()
    assert "python3 -m venv $VENV" in lines  # the whole chain is shown
    installs = [line for line in lines if " install " in line]
    assert any(line.endswith('install -q "torch==2.13.0"') for line in installs), installs
    assert any(line.endswith("install -q -e .") for line in installs), installs
    assert lines[-1].endswith("python scripts/demo.py")
    named = [tool for tool in TEST_TOOLS if tool in commands]
    assert named == [], f"`make demo` installs {named}:\n{commands}"


@needs_make
def test_make_test_after_the_demo_installs_the_test_tools(tmp_path: Path) -> None:
    """A ``.venv`` the demo built (its python exists) still gets the dev tools from make test."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    commands = make_dry_run("test", venv)
    assert "python3 -m venv" not in commands  # the demo's venv is kept
    uv = '$VENV/bin/uv pip install -q --compile-bytecode --python $VENV/bin/python -e ".[dev]"'
    assert uv in commands
    assert "dirichletcal" in commands
    for tool in ("ruff check", "mypy", "pytest"):  # the strict docs build is one of the tests
        assert f"$VENV/bin/{tool}" in commands, tool


# --- the README's first screen -----------------------------------------------------------------


def first_screen() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()[:40]


def test_readme_first_screen_is_the_library_the_make_commands_and_the_advice() -> None:
    lines = first_screen()
    assert lines[0] == "# lightning-losses"
    assert "Classification losses" in lines[2]
    commands = [line.split("#")[0].strip() for line in lines]
    demo, test = commands.index("make demo"), commands.index("make test")
    advice = lines.index("## Which loss should I start with")
    assert demo < advice
    assert test < advice
    bullets = [line for line in lines[advice:] if line.startswith("- **")]
    assert bullets, "the advice begins within the first 40 lines"


def commit_like_words(lines: list[str]) -> list[str]:
    """Words of 7 to 40 hex digits with a letter among them (what a commit's name looks like).

    Example:
        >>> commit_like_words(["at commit `f8a35a8`, 1234567 runs, 0.0535, deadbeef0"])
        ['f8a35a8', 'deadbeef0']
    """
    words = re.findall(r"\b[0-9a-f]{7,40}\b", "\n".join(lines))
    return [word for word in words if re.search("[a-f]", word)]


def digit_commits(lines: list[str]) -> list[str]:
    """Words of 7 to 40 decimal digits that name a commit of this repository."""
    found = []
    for word in re.findall(r"\b[0-9]{7,40}\b", "\n".join(lines)):
        done = subprocess.run(
            ["git", "cat-file", "-e", f"{word}^{{commit}}"], cwd=ROOT, capture_output=True
        )
        if done.returncode == 0:
            found.append(word)
    return found


def test_readme_first_40_lines_name_no_commit() -> None:
    lines = first_screen()
    assert commit_like_words(lines) == []
    assert digit_commits(lines) == []


def test_the_commit_check_sees_a_commit() -> None:
    """The check above fails on the README as it was (a hash in its first 40 lines)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if not head:
        pytest.skip("not a git clone: no commit to name")
    line = [f"trained at commit `{head}`"]
    assert commit_like_words(line) + digit_commits(line) == [head]


def test_the_provenance_is_on_the_evidence_page() -> None:
    """What left the README (commits and code versions of the committed report) is there."""
    evidence = (DOCS / "reproduce.md").read_text(encoding="utf-8")
    assert "## The committed report: which code made which numbers" in evidence
    link = "docs/reproduce.md#the-committed-report-which-code-made-which-numbers"
    assert link in "\n".join(first_screen())
    section = evidence[evidence.index("## The committed report") :]
    for commit in ("f8a35a8", "668d495", "5be6d23", "832ebd3", "b33c68d", "289c8bd"):
        assert f"commit `{commit}`" in section, commit


# --- the docs' home page -----------------------------------------------------------------------


def load_file(path: Path):
    """The module of the file ``path`` (a script or a hook, not a package module)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_hook():
    """The MkDocs hook that makes the home page, ``docs/readme_page.py``."""
    return load_file(DOCS / "readme_page.py")


class _Page:
    def __init__(self, src_uri: str) -> None:
        self.file = type("File", (), {"src_uri": src_uri})()


def test_docs_home_page_is_the_readme() -> None:
    hook = readme_hook()
    mkdocs_yml = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^hooks:\n  - docs/readme_page\.py$", mkdocs_yml, re.MULTILINE)
    home = hook.on_page_markdown("(index.md as written)", page=_Page("index.md"))
    other = hook.on_page_markdown("# CLI", page=_Page("cli.md"))
    assert other == "# CLI"
    readme = README.read_text(encoding="utf-8")
    assert home == hook.readme_for_site(readme)
    assert "## Which loss should I start with" in home
    for number in ("0.0535", "0.0093", "0.0197", "0.945", "110.2", "1.463"):
        assert number in home
    # docs/index.md holds no second copy that could fall behind
    assert "Which loss" not in (DOCS / "index.md").read_text(encoding="utf-8")


def test_home_page_links_name_pages_of_the_site() -> None:
    home = readme_hook().readme_for_site(README.read_text(encoding="utf-8"))
    text = re.sub(r"^```.*?^```", "", home, flags=re.MULTILINE | re.DOTALL)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert len(relative) >= 10
    missing = [t for t in relative if not (DOCS / t.split("#")[0]).is_file()]
    assert missing == []


# --- counts the pages state --------------------------------------------------------------------


def demo_configs() -> list[str]:
    return list(load_file(ROOT / "scripts" / "demo.py").CONFIGS)


def fit_configs() -> list[Path]:
    """The configs ``lightning-losses fit`` runs: the top-level ``configs/*.yaml``."""
    return sorted(CONFIGS.glob("*.yaml"))


def test_fit_lists_the_top_level_configs() -> None:
    """The names ``fit --help`` lists are the files counted here (and lm's, lm's folder)."""
    from lightning_losses.cli.config_files import config_names

    assert config_names("fit") == [p.stem for p in fit_configs()]
    assert config_names("lm") == sorted(p.stem for p in CONFIGS.glob("lm/*.yaml"))


def real_counts() -> list[tuple[re.Pattern[str], int, str]]:
    """(pattern of a stated count, the real count, what is counted), the first match wins."""
    from lightning_losses.reproduce.claims import CLAIMS, LITERATURE_LOSSES

    posthoc = [p for p in fit_configs() if "PostHocCalibration" in p.read_text()]
    rules = [
        (rf"fits {NUMBER} shipped configs", len(demo_configs()), "the demo's configs"),
        (rf"{NUMBER} shipped configs add it", len(posthoc), "configs with PostHocCalibration"),
        (rf"{NUMBER} shipped configs", len(fit_configs()), "fit's configs (configs/*.yaml)"),
        (rf"{NUMBER} (?:lm|language-model) configs", len(list(CONFIGS.glob("lm/*.yaml"))), "lm"),
        (rf"{NUMBER} claims", len(CLAIMS), "reproduce's claims"),
        (rf"{NUMBER} losses from the calibration literature", len(LITERATURE_LOSSES), "losses"),
    ]
    return [(re.compile(p, re.IGNORECASE), n, what) for p, n, what in rules]


#: A count of a set the repository defines (configs of a kind, claims, the literature's losses,
#: calibrators): each must be one a rule knows. "two configs" alone is no such count.
STATED = re.compile(
    rf"\b{NUMBER}\s+(?:(?:shipped|fit|lm|language-model)\s+configs|claims|losses from|"
    r"(?:post-hoc\s+)?calibrators)\b",
    re.IGNORECASE,
)


def as_number(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def stated_counts(text: str, rules) -> list[tuple[str, int, int, str]]:
    """``(phrase, stated, real, what)`` for each count in ``text``; real -1: no rule knows it.

    A count belongs to the first rule that matches with its number at the same place.

    Example:
        >>> rules = [(re.compile(rf"{NUMBER} claims", re.I), 9, "claims")]
        >>> stated_counts("all nine claims; Six losses from papers; two configs", rules)
        [('nine claims', 9, 9, 'claims'), ('Six losses from', 6, -1, '')]
    """
    known: dict[int, tuple[int, str]] = {}
    for rule, real, what in rules:
        for hit in rule.finditer(text):
            known.setdefault(hit.start(1), (real, what))
    found = []
    for match in STATED.finditer(text):
        real, what = known.get(match.start(1), (-1, ""))
        found.append((match.group(0), as_number(match.group(1)), real, what))
    return found


@pytest.mark.parametrize(
    "page",
    [README, *sorted(DOCS.glob("*.md"))],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_each_stated_count_is_the_real_count(page: Path) -> None:
    text = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))  # a phrase may wrap
    wrong = [
        f"{phrase!r}: {'no rule counts it' if real < 0 else f'{what} are {real}'}"
        for phrase, stated, real, what in stated_counts(text, real_counts())
        if stated != real
    ]
    assert wrong == [], f"{page.relative_to(ROOT)}: {wrong}"


def test_the_counts_are_found() -> None:
    """The rules see the counts the README states (a check that could not fail otherwise)."""
    text = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    found = stated_counts(text, real_counts())
    whats = {what for _, _, _, what in found}
    assert {"the demo's configs", "fit's configs (configs/*.yaml)"} <= whats
    wrong = stated_counts(
        "fit --help lists 41 shipped configs; the demo fits 41 shipped configs", real_counts()
    )
    assert [(stated, real) for _, stated, real, _ in wrong] == [
        (41, len(fit_configs())),
        (41, len(demo_configs())),
    ]
