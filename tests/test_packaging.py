"""Packaging: a light top-level import, a complete wheel built without warnings, the script."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light():
    code = (
        "import sys, lightning_losses, lightning_losses.functional\n"
        "heavy = [m for m in ('mlflow', 'netcal', 'matplotlib', 'sklearn') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_wheel_holds_every_subpackage_and_builds_without_warnings(tmp_path):
    """A wheel (what a user installs) holds every subpackage, and building it warns nothing."""
    import zipfile
    from pathlib import Path

    import lightning_losses

    root = Path(lightning_losses.__file__).resolve().parents[1]
    # Built as pip builds it on install: in an isolated environment with the build requirements.
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path)]
    built = subprocess.run(
        [*pip_wheel, str(root)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    # Warnings of the build (setuptools' deprecations, its editable-layout notice), not pip's
    # notes about this machine's package index ("Location '...' is ignored").
    lines = (built.stdout + built.stderr).splitlines()
    warned = [line for line in lines if "warning" in line.lower() and "is ignored" not in line]
    assert warned == []
    (wheel,) = tmp_path.glob("lightning_losses-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(p.parent.relative_to(root)) for p in root.glob("lightning_losses/**/*.py")}
    packages = {p for p in packages if "__pycache__" not in p}
    assert {"lightning_losses/callbacks", "lightning_losses/compare"} <= packages
    for package in packages:
        assert f"{package}/__init__.py" in names, package
    assert "lightning_losses/default_config.yaml" in names
    assert not {n for n in names if not n.startswith("lightning_losses")} - {
        n for n in names if ".dist-info/" in n
    }  # nothing else (tests, scripts, docs) at the top level
