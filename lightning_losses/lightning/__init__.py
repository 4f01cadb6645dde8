"""The Lightning layer: the loss mixin, the ready classifier, its backbones and evaluation.

- :mod:`~lightning_losses.lightning.mixin`: :class:`LossMixin` and :func:`build_criterion`,
  a criterion chosen in YAML for any LightningModule;
- :mod:`~lightning_losses.lightning.classifier`: :class:`ClassifierModule`;
- :mod:`~lightning_losses.lightning.backbones`: :class:`MLP` and :class:`CNN1D`;
  :mod:`~lightning_losses.lightning.backbone_spec`: backbones described in YAML;
- :mod:`~lightning_losses.lightning.class_path`: the one place a ``class_path`` becomes an object;
- :mod:`~lightning_losses.lightning.evaluation`: the float64 means that log per-task NLL and
  accuracy (their per-term maths: :mod:`lightning_losses.functional.evaluation`).
"""

from __future__ import annotations

from lightning_losses.lightning.backbones import CNN1D, MLP
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.lightning.mixin import LossMixin, build_criterion

__all__ = ["CNN1D", "MLP", "ClassifierModule", "LossMixin", "build_criterion"]
