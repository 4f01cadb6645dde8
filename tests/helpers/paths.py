"""The repository's folders and the console scripts installed beside this Python."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["CONFIGS", "DOCS", "MLFLOW", "ROOT", "SCRIPT"]

#: The repository (the folder of pyproject.toml).
ROOT = Path(__file__).resolve().parents[2]
#: The example configs (``configs/``).
CONFIGS = ROOT / "configs"
#: The documentation pages (``docs/``).
DOCS = ROOT / "docs"
#: The ``lightning-losses`` console script of the running environment.
SCRIPT = Path(sys.executable).with_name("lightning-losses")
#: The ``mlflow`` console script of the running environment.
MLFLOW = Path(sys.executable).with_name("mlflow")
