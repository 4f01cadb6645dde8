"""The import graph follows the layer order of docs/development.md, and has no circles.

Every ``import`` of a ``lightning_losses`` module anywhere in a module (at the top, inside a
function, under ``TYPE_CHECKING``) is an edge. A module may import modules of its own layer and
of lower layers only; the console entry (``lightning_losses.cli.console``) is the top, and
nothing imports it. Read from the source with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "lightning_losses"

#: Lowest first: the layer order of docs/development.md (each entry: a module name pattern).
LAYERS: list[tuple[str, str]] = [
    ("base", r"lightning_losses(\._lazy|\.loss_names|\.loss_ranges|\.warning)?"),
    ("kernels", r"lightning_losses\.kernels(\..*)?"),
    ("functional", r"lightning_losses\.functional(\..*)?"),
    ("losses", r"lightning_losses\.(losses|heads|registry)"),
    ("calibration", r"lightning_losses\.calibration(\..*)?"),
    ("data", r"lightning_losses\.data(\..*)?"),
    ("lightning", r"lightning_losses\.lightning(\..*)?"),
    ("tracking", r"lightning_losses\.tracking(\..*)?"),
    ("callbacks", r"lightning_losses\.callbacks(\..*)?"),
    ("cli", r"lightning_losses\.cli(\.(?!console$).*)?"),
    ("lm", r"lightning_losses\.lm(\..*)?"),
    ("integrations", r"lightning_losses\.integrations(\..*)?"),
    ("compare", r"lightning_losses\.compare(\..*)?"),
    ("reproduce", r"lightning_losses\.reproduce(\..*)?"),
    ("console", r"lightning_losses\.cli\.console"),
]


def modules() -> dict[str, Path]:
    """Every module of the installed layout (the callbacks link followed), by dotted name."""
    found = {}
    for folder, _, files in os.walk(ROOT / PACKAGE, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                parts = (Path(folder) / file).relative_to(ROOT).with_suffix("").parts
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found[name] = Path(folder) / file
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (``from pkg import sub`` counts as ``sub``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != PACKAGE:
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            # ``from lightning_losses import functional`` imports the subpackage, and the
            # package itself only for the names that are not submodules
            found.update(subs if len(subs) == len(node.names) else {node.module, *subs})
    return found & known


def layer(name: str) -> int:
    """The layer's index in :data:`LAYERS`; the last match wins (the console is in ``cli``)."""
    ranks = [i for i, (_, pattern) in enumerate(LAYERS) if re.fullmatch(pattern, name)]
    assert ranks, f"{name} is in no layer of LAYERS (docs/development.md lists them)"
    return ranks[-1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: imports(path, set(known)) - {name} for name, path in known.items()}
    # The root package is a facade: its own imports are the lazy exports' TYPE_CHECKING names.
    edges[PACKAGE] = set()
    return edges


def test_every_module_belongs_to_a_layer(graph):
    assert len(graph) > 80
    for name in graph:
        layer(name)


def test_no_module_imports_a_higher_layer(graph):
    upward = [
        f"{name} ({LAYERS[layer(name)][0]}) imports {dep} ({LAYERS[layer(dep)][0]})"
        for name, deps in graph.items()
        for dep in deps
        if layer(dep) > layer(name)
    ]
    assert upward == []


def test_calibration_depends_only_on_functional_and_tracking_never_on_the_command_line(graph):
    for name, deps in graph.items():
        if name.startswith(f"{PACKAGE}.calibration"):
            assert {layer(d) for d in deps} <= {0, 1, 2, layer(name)}, name  # base to functional
        if name.startswith(f"{PACKAGE}.tracking"):
            assert not {d for d in deps if d.startswith(f"{PACKAGE}.cli")}, name
    assert not [name for name, deps in graph.items() if f"{PACKAGE}.cli.console" in deps]


def test_the_import_graph_has_no_circles(graph):
    """A depth-first search finds no module reachable from itself."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep] if dep in path else [name, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert circles == []


def test_the_documented_order_is_this_test_s_order():
    text = (ROOT / "docs" / "development.md").read_text()
    documented = re.search(r"Layers, lowest first: (.*?)\.\n", text, re.S)
    assert documented, "docs/development.md must state 'Layers, lowest first: ...'"
    names = [n.strip(" `\n") for n in documented.group(1).replace("\n", " ").split("<")]
    assert names == [name for name, _ in LAYERS]
