"""Pure loss functions: tensors in, tensors out; no ``nn.Module``, no Lightning.

Every function takes logits first and the target second, keyword-only hyper-parameters, a
``reduction`` in ``none|mean|sum`` and ``validate_args``; index-target losses take
``ignore_index`` and logits ``[N, C, *]`` like :func:`torch.nn.functional.cross_entropy`.
"""

from lightning_losses.functional.adafocal import adafocal_loss, adafocal_update
from lightning_losses.functional.binary import (
    binary_focal_loss,
    binary_hard_truncated_loss,
    binary_soft_truncated_loss,
)
from lightning_losses.functional.calibration_penalties import (
    dca_loss,
    dca_penalty,
    mdca_loss,
    mdca_penalty,
    mmce_loss,
    mmce_penalty,
)
from lightning_losses.functional.dual_focal import dual_focal_loss
from lightning_losses.functional.exact import exact_log_probability, exact_loss
from lightning_losses.functional.linear import linear_target_loss
from lightning_losses.functional.margin import mbls_loss
from lightning_losses.functional.multilabel import (
    multilabel_categorical_crossentropy,
    nm_categorical_crossentropy,
)
from lightning_losses.functional.scale import feature_incay, normface_min_scale
from lightning_losses.functional.target_probability import (
    adaptive_focal_loss,
    cross_entropy,
    focal_loss,
    gamma_cross_entropy,
    hard_truncated_loss,
    poly1_loss,
    soft_accuracy_loss,
)
from lightning_losses.functional.truncation import soft_truncated_loss

__all__ = [
    "adafocal_loss",
    "adafocal_update",
    "adaptive_focal_loss",
    "binary_focal_loss",
    "binary_hard_truncated_loss",
    "binary_soft_truncated_loss",
    "cross_entropy",
    "dca_loss",
    "dca_penalty",
    "dual_focal_loss",
    "exact_log_probability",
    "exact_loss",
    "feature_incay",
    "focal_loss",
    "gamma_cross_entropy",
    "hard_truncated_loss",
    "linear_target_loss",
    "mbls_loss",
    "mdca_loss",
    "mdca_penalty",
    "mmce_loss",
    "mmce_penalty",
    "multilabel_categorical_crossentropy",
    "nm_categorical_crossentropy",
    "normface_min_scale",
    "poly1_loss",
    "soft_accuracy_loss",
    "soft_truncated_loss",
]
