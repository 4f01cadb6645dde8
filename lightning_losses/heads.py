"""Scaled-cosine classification heads: NormFace, CosFace and ArcFace.

After Wang Feng, "Understanding softmax: controlling its smoothness".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_losses.functional.checks import check_choice, check_int, check_range
from lightning_losses.functional.scale import feature_norm, normface_min_scale

KINDS = ("normface", "cosface", "arcface")


class NormFaceHead(nn.Module):
    """Logits ``scale * cos(feature, class weight)``, with an optional margin on the target.

    Softmax over cosines in ``[-1, 1]`` cannot approach a one-hot distribution: with ``C``
    classes a probability ``p`` needs a scale of at least
    :func:`~lightning_losses.functional.normface_min_scale` ``(C, p)``. ``scale=None`` learns
    the scale (NormFace), starting at the minimum scale for ``p = 0.99``; a float fixes it (a
    plain attribute that a schedule may change).

    With ``target`` given (training), the target's cosine ``c`` becomes ``c - margin``
    (``"cosface"``, additive cosine margin) or ``cos(arccos(c) + margin)`` (``"arcface"``,
    additive angular margin, continued as ``c - margin * sin(margin)`` where ``arccos(c) +
    margin`` would pass ``pi``). Without ``target`` (evaluation) the plain cosines are scaled.

    A feature row of zeros (a ReLU backbone whose units are all off for one input) has no
    direction: its cosines are 0, so its logits are 0 and its softmax is uniform, and its
    gradient is the one of ``f @ unit_weight.T`` (finite, towards the target's weight) instead
    of the ``1 / eps`` blow-up of ``f / max(||f||, eps)``. Training does not stop on such a row.

    Sources: Wang et al., NormFace (2017); Wang et al., CosFace (2018); Deng et al., ArcFace
    (2019).

    Args:
        in_features: feature size ``D``.
        num_classes: ``C``.
        scale: fixed scale ``> 0``, or ``None`` for a learnable one.
        margin: margin on the target, ``>= 0`` (ignored by ``"normface"``).

    Raises:
        ValueError: ``kind``, ``margin`` or ``scale`` out of range (see
            :meth:`check_hyperparameters`), at construction and at any call.
        kind: ``"normface"``, ``"cosface"`` or ``"arcface"``.

    Example:
        >>> head = NormFaceHead(4, 3, scale=10.0)
        >>> logits = head(torch.randn(2, 4))
        >>> logits.shape, bool(logits.abs().max() <= 10.0)
        (torch.Size([2, 3]), True)
        >>> head(torch.zeros(1, 4))
        tensor([[0., 0., 0.]], grad_fn=<MulBackward0>)
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        scale: float | None = None,
        margin: float = 0.0,
        kind: str = "normface",
    ) -> None:
        super().__init__()
        in_features = check_int("in_features", in_features, low=1)
        num_classes = check_int("num_classes", num_classes, low=1)
        self.in_features = in_features
        self.num_classes = num_classes
        self.kind = kind
        self.margin = margin
        self.weight = nn.Parameter(torch.empty(num_classes, in_features))
        nn.init.xavier_uniform_(self.weight)
        self.scale: nn.Parameter | float  # learnable, or fixed
        if scale is None:
            start = max(1.0, normface_min_scale(num_classes, 0.99)) if num_classes > 1 else 1.0
            self.scale = nn.Parameter(torch.tensor(start))
        else:
            self.scale = scale
        self.check_hyperparameters()

    def check_hyperparameters(self) -> None:
        """Check the current ``kind``, ``margin`` and (fixed) ``scale``; the forward call too.

        ``kind`` is one of ``normface``, ``cosface``, ``arcface``; ``margin`` a finite number
        ``>= 0``; a fixed ``scale`` a finite number ``> 0`` (a learnable one is not checked).

        Raises:
            ValueError: a value out of range, naming the attribute and the range.
            TypeError: a value that is not a number.
        """
        check_choice("kind", self.kind, KINDS)
        check_range("margin", self.margin, low=0.0)
        if not isinstance(self.scale, nn.Parameter):
            check_range("scale", self.scale, low=0.0, low_open=True)

    def cosine(self, features: Tensor) -> Tensor:
        """``cos(feature, class weight)``, ``[N, C]``; 0 for a zero feature row."""
        norm = feature_norm(features, validate_args=False)
        # A zero row is divided by 1: it stays zero, with a bounded gradient.
        unit_features = features / torch.where(norm > 0, norm, 1.0)[..., None]
        unit_weight = self.weight / torch.linalg.vector_norm(self.weight, dim=1, keepdim=True)
        return unit_features @ unit_weight.to(features.dtype).T

    def _with_margin(self, cos: Tensor, target: Tensor) -> Tensor:
        c = cos.gather(1, target[:, None])
        if self.kind == "cosface":
            shifted = c - self.margin
        else:
            m = self.margin
            sin = torch.sqrt(((1 - c) * (1 + c)).clamp_min(torch.finfo(c.dtype).eps))
            rotated = c * math.cos(m) - sin * math.sin(m)
            shifted = torch.where(c > math.cos(math.pi - m), rotated, c - m * math.sin(m))
        return cos.scatter(1, target[:, None], shifted)

    def forward(self, features: Tensor, target: Tensor | None = None) -> Tensor:
        """Logits ``scale * cos`` ``[N, C]``; with ``target``, its class's margin applied."""
        self.check_hyperparameters()  # a schedule may have set them; it costs nothing
        cos = self.cosine(features)
        if target is not None and self.kind != "normface" and self.margin > 0:
            cos = self._with_margin(cos, target)
        return self.scale * cos

    def extra_repr(self) -> str:
        """The head's sizes, kind, scale and margin, for ``repr``."""
        scale = "learnable" if isinstance(self.scale, nn.Parameter) else self.scale
        return (
            f"in_features={self.in_features}, num_classes={self.num_classes}, "
            f"kind={self.kind!r}, scale={scale}, margin={self.margin}"
        )
