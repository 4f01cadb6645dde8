"""Packaging: a light top-level import, the callbacks package mapping, the console script."""

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


def test_callbacks_folder_is_the_callbacks_subpackage():
    import lightning_losses.callbacks as callbacks

    assert callbacks.__name__ == "lightning_losses.callbacks"
    assert callbacks.__file__.replace("\\", "/").endswith("callbacks/__init__.py")
    assert hasattr(callbacks, "GammaAnnealing")
