"""Backbones described in YAML: build, describe, probe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lightning_losses.lightning.class_path import import_path, instantiate


def is_plain(value: Any) -> bool:
    """Whether ``value`` is plain data (``None``, str, numbers, lists and str-keyed dicts of them).

    Checkpoints keep plain hyper-parameters only, so that they load with ``weights_only=True``.

    Example:
        >>> is_plain({"hidden": [32, 16], "dropout": 0.1}), is_plain({"backbone": nn.ReLU()})
        (True, False)
    """
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


#: ``hidden`` and ``dropout`` of the default backbone (a given backbone leaves them so).
DEFAULT_HIDDEN = (128, 64)
DEFAULT_DROPOUT = 0.0


def build_backbone(spec: Mapping[str, Any]) -> nn.Module:
    """Build a backbone from its ``{"class_path": ..., "init_args": {...}}`` description.

    Raises:
        ValueError: starting with ``backbone``, for a mapping with other keys, a path that does
            not import or that names no ``nn.Module`` subclass
            (:func:`~lightning_losses.lightning.class_path.instantiate`).

    Example:
        >>> path = "lightning_losses.lightning.backbones.CNN1D"
        >>> cnn = build_backbone({"class_path": path, "init_args": {"channels": 8}})
        >>> type(cnn).__name__, cnn.channels
        ('CNN1D', 8)
    """
    return instantiate(spec, argument="backbone", base=nn.Module)


def describe_backbone(backbone: nn.Module) -> dict[str, Any] | None:
    """``{"class_path", "init_args"}`` of a backbone that keeps plain ``init_args``, else None.

    The class must be importable back from its ``class_path`` (not defined in a function).

    Example:
        >>> from lightning_losses.lightning.backbones import CNN1D
        >>> describe_backbone(CNN1D(channels=8))
        {'class_path': 'lightning_losses.lightning.backbones.CNN1D', 'init_args': {'channels': 8}}
        >>> describe_backbone(nn.Linear(4, 2)) is None  # no init_args: not described
        True
    """
    init_args = getattr(backbone, "init_args", None)
    if not isinstance(init_args, Mapping) or not is_plain(init_args):
        return None
    cls = type(backbone)
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    try:
        if import_path(class_path, argument="backbone") is not cls:
            return None
    except ValueError:
        return None
    return {"class_path": class_path, "init_args": dict(init_args)}


def backbone_features(backbone: nn.Module, input_dim: int) -> int:
    """``F`` of a backbone mapping ``[2, input_dim]`` to ``[2, F]``, by one forward pass.

    The pass runs in eval mode under ``torch.no_grad()`` (the mode is restored after), on the
    device and dtype of the backbone's first parameter.

    Raises:
        ValueError: naming ``backbone``, the input shape and what came out, if the backbone
            fails on that input or gives anything but a 2-D ``[2, F]`` tensor.
    """
    parameter = next(backbone.parameters(), None)
    options: dict[str, Any] = (
        {} if parameter is None else {"device": parameter.device, "dtype": parameter.dtype}
    )
    if parameter is not None and not parameter.is_floating_point():
        options.pop("dtype")
    probe = torch.zeros(2, input_dim, **options)
    name = type(backbone).__name__
    training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            features = backbone(probe)
    except Exception as error:
        raise ValueError(
            f"backbone {name} must map inputs [N, input_dim] to features [N, F]; on an input "
            f"of shape [2, {input_dim}] (input_dim={input_dim}) it raised "
            f"{type(error).__name__}: {error}"
        ) from error
    finally:
        backbone.train(training)
    if not isinstance(features, Tensor):
        got = f"a {type(features).__name__}"
    elif features.dim() != 2 or features.shape[0] != 2:
        got = f"shape {list(features.shape)}"
    else:
        return int(features.shape[1])
    raise ValueError(
        f"backbone {name} must map inputs [N, input_dim] to features [N, F]; on an input of "
        f"shape [2, {input_dim}] (input_dim={input_dim}) it gave {got}"
    )
