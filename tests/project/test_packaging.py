"""Packaging: a light top-level import, a complete wheel built without warnings, the script."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import lightning_losses

ROOT = Path(lightning_losses.__file__).resolve().parents[1]


def test_import_is_light():
    code = (
        "import sys, lightning_losses, lightning_losses.functional\n"
        "heavy = [m for m in ('mlflow', 'netcal', 'matplotlib', 'sklearn') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel pip builds of the project, and the build's output (built once per module)."""
    folder = tmp_path_factory.mktemp("wheel")
    # Built as pip builds it on install: in an isolated environment with the build requirements.
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder)]
    done = subprocess.run([*pip_wheel, str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (wheel,) = folder.glob("lightning_losses-*.whl")
    return wheel, done.stdout + done.stderr


@pytest.mark.slow
def test_the_wheel_holds_every_subpackage_and_builds_without_warnings(built):
    """A wheel (what a user installs) holds every subpackage, and building it warns nothing."""
    wheel, output = built
    # Warnings of the build (setuptools' deprecations, its editable-layout notice), not pip's
    # notes about this machine's package index ("Location '...' is ignored").
    lines = output.splitlines()
    warned = [line for line in lines if "warning" in line.lower() and "is ignored" not in line]
    assert warned == []
    names = set(zipfile.ZipFile(wheel).namelist())
    # os.walk with followlinks: lightning_losses/callbacks is the top-level callbacks/ folder
    packages = {
        str(Path(folder).relative_to(ROOT))
        for folder, _, files in os.walk(ROOT / "lightning_losses", followlinks=True)
        if "__init__.py" in files
    }
    assert {"lightning_losses/callbacks", "lightning_losses/compare"} <= packages
    for package in packages:
        assert f"{package}/__init__.py" in names, package
    assert "lightning_losses/default_config.yaml" in names
    assert not {n for n in names if not n.startswith("lightning_losses")} - {
        n for n in names if ".dist-info/" in n
    }  # nothing else (tests, scripts, docs) at the top level


@pytest.mark.slow
def test_the_wheel_ships_every_config_of_the_top_level_folder(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(path.relative_to(ROOT) for path in (ROOT / "configs").rglob("*.yaml"))
    assert len(shipped) >= 30
    for path in shipped:
        assert f"lightning_losses/{path.as_posix()}" in names, path


@pytest.mark.slow
def test_an_installed_wheel_runs_a_shipped_config_by_name(built, tmp_path):
    """Install the wheel in a fresh venv; ``fit --config digits_focal`` from an empty folder."""
    wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    subprocess.run([*install, "--no-deps", "--no-index", str(wheel)], check=True)
    # The dependencies (torch, Lightning...) from this venv; not this checkout's package: a path
    # in a .pth file is added to sys.path, but the .pth files there (the editable install's)
    # are not read.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [str(python), "-c", "import lightning_losses; print(lightning_losses.__file__)"],
        capture_output=True,
        text=True,
        cwd=empty,
        env=env,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed package, not the checkout
    script = venv / "bin" / "lightning-losses"
    command = [str(script), "fit", "--config", "digits_focal", "--print_config"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=empty, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    criterion = done.stdout.split("  criterion:\n", 1)[1]
    assert criterion.startswith("    class_path: lightning_losses.FocalLoss\n"), criterion[:200]
    assert "      gamma: 2.0\n" in criterion.split("  hidden:", 1)[0]
    assert list(empty.iterdir()) == []  # --print_config wrote nothing


@pytest.mark.slow
def test_an_editable_install_maps_the_top_level_callbacks_folder_without_warnings(tmp_path):
    """``pip install -e .`` in a fresh venv: ``lightning_losses.callbacks`` is ``callbacks/``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    done = subprocess.run([*install, "-e", str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    warned = [line for line in lines if "warning" in line.lower() and "is ignored" not in line]
    assert warned == []  # no setuptools notice about an import-hook (strict) editable install
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    code = (
        "import lightning_losses.callbacks as c, lightning_losses as p\n"
        "print(c.__file__); print(p.__file__); print(c.GammaAnnealing.__module__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=empty, env=env, check=True
    ).stdout.split()
    assert Path(out[0]).resolve() == ROOT / "callbacks" / "__init__.py"
    assert Path(out[1]).resolve() == ROOT / "lightning_losses" / "__init__.py"
    assert out[2] == "lightning_losses.callbacks.loss_scheduler"
