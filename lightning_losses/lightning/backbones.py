"""Feature extractors for :class:`~lightning_losses.lightning.classifier.ClassifierModule`.

A backbone maps a batch of inputs ``[N, input_dim]`` to features ``[N, F]``; the classifier's
head (linear or scaled cosine) turns the features into logits. Each backbone here keeps its
constructor arguments in ``init_args`` (a plain dict), so that a checkpoint can describe it as
``{"class_path": ..., "init_args": ...}`` and ``load_from_checkpoint`` can build it again.

- :class:`MLP`: ``Linear -> ReLU (-> Dropout)`` per hidden size, the classifier's default.
- :class:`CNN1D`: the three-layer 1-D convolutional network of Greydanus, "Scaling down deep
  learning" (2020), the MNIST-1D benchmark, without its linear classifier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from torch import Tensor, nn

from lightning_losses.functional.checks import check_int, check_range

__all__ = ["CNN1D", "MLP"]


class MLP(nn.Sequential):
    """``Linear -> ReLU (-> Dropout)`` for each size in ``hidden``: ``[N, input_dim] -> [N, F]``.

    ``F`` (``out_features``) is the last hidden size, or ``input_dim`` when ``hidden`` is empty:
    then the MLP is the identity, and a classifier built on it with a linear head is a
    (multinomial) logistic regression. Layers are numbered as in an ``nn.Sequential``
    (``0.weight``, ``0.bias``, ``2.weight``...), the layout of ``ClassifierModule``'s backbone.

    Args:
        input_dim: features of each input, ``>= 1``.
        hidden: sizes of the hidden layers, each ``>= 1``; empty for the identity.
        dropout: dropout probability after each hidden layer, in ``[0, 1)``; 0 adds no layer.

    Example:
        >>> import torch
        >>> mlp = MLP(64, hidden=[32, 16], dropout=0.1)
        >>> mlp(torch.randn(5, 64)).shape, mlp.out_features
        (torch.Size([5, 16]), 16)
        >>> mlp.init_args
        {'input_dim': 64, 'hidden': [32, 16], 'dropout': 0.1}
        >>> MLP(64, hidden=[]).out_features  # the identity: logistic regression under a head
        64
    """

    def __init__(
        self, input_dim: int, hidden: Sequence[int] = (128, 64), dropout: float = 0.0
    ) -> None:
        input_dim = check_int("input_dim", input_dim, low=1)
        if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
            raise TypeError(f"hidden must be a sequence of positive ints; got {hidden!r}")
        sizes = [check_int("hidden", size, low=1) for size in hidden]
        check_range("dropout", dropout, low=0.0, high=1.0, high_open=True)
        layers: list[nn.Module] = []
        width = input_dim
        for size in sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = size
        super().__init__(*layers)
        self.out_features = width
        self.init_args: dict[str, Any] = {
            "input_dim": input_dim,
            "hidden": sizes,
            "dropout": float(dropout),
        }


class CNN1D(nn.Module):
    """The CNN of MNIST-1D (Greydanus, "Scaling down deep learning", 2020), head excluded.

    ``[N, L]`` (or ``[N, 1, L]``) ``-> Conv1d(1, c, 5, stride 2, padding 1) -> ReLU ->
    Conv1d(c, c, 3, 2, 1) -> ReLU -> Conv1d(c, c, 3, 2, 1) -> ReLU -> flatten``. Each
    convolution maps a length ``l`` to ``floor((l + 2 - k) / 2) + 1`` for kernel ``k``, so the
    ``F = c * L3`` features depend on the input's length: ``L = 40`` (MNIST-1D) gives
    ``L3 = 5`` and, with the paper's ``c = 25``, ``F = 125``, the input of the paper's
    ``Linear(125, 10)`` classifier (here the head of the ``ClassifierModule``).

    ``out_features`` is ``None`` (unknown until the length is); :meth:`output_features` gives
    it for a length.

    Args:
        channels: ``c``, the channels of each convolution, ``>= 1``.

    Example:
        >>> import torch
        >>> cnn = CNN1D(channels=25)
        >>> cnn(torch.randn(3, 40)).shape
        torch.Size([3, 125])
        >>> cnn.output_features(40), cnn.output_features(64)
        (125, 200)
    """

    def __init__(self, channels: int = 25) -> None:
        super().__init__()
        channels = check_int("channels", channels, low=1)
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.activation = nn.ReLU()
        self.channels = channels
        self.out_features: int | None = None
        self.init_args: dict[str, Any] = {"channels": channels}

    def output_features(self, length: int) -> int:
        """The number of features ``F`` for inputs of length ``length``."""
        for conv in (self.conv1, self.conv2, self.conv3):
            # built above with integer padding, which Conv1d keeps as a 1-tuple (never a string)
            padding_tuple = cast(tuple[int], conv.padding)
            (kernel,), (stride,), (padding,) = conv.kernel_size, conv.stride, padding_tuple
            length = (length + 2 * padding - kernel) // stride + 1
        return self.channels * length

    def forward(self, x: Tensor) -> Tensor:
        """Features ``[N, F]`` of inputs ``[N, L]`` or ``[N, 1, L]``."""
        if x.dim() == 2:
            x = x.unsqueeze(1)
        if x.dim() != 3 or x.shape[1] != 1:
            raise ValueError(
                f"CNN1D input must have shape [N, L] or [N, 1, L]; got {list(x.shape)}"
            )
        h = self.activation(self.conv1(x))
        h = self.activation(self.conv2(h))
        h = self.activation(self.conv3(h))
        return h.flatten(1)
