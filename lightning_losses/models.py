"""``ClassifierModule``: a ready LightningModule for the command line and the experiments."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from .backbones import MLP
from .heads import NormFaceHead
from .mixins import LossMixin, _import_class, describe_criterion

TASKS = ("multiclass", "binary", "multilabel", "nm")
HEADS = ("linear", "normface", "cosface", "arcface")

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


#: ``hidden`` and ``dropout`` of the default backbone (a given backbone leaves them so).
DEFAULT_HIDDEN = (128, 64)
DEFAULT_DROPOUT = 0.0


def build_backbone(spec: Mapping[str, Any]) -> nn.Module:
    """Build a backbone from its ``{"class_path": ..., "init_args": {...}}`` description.

    Example:
        >>> cnn = build_backbone(
        ...     {"class_path": "lightning_losses.backbones.CNN1D", "init_args": {"channels": 8}}
        ... )
        >>> type(cnn).__name__, cnn.channels
        ('CNN1D', 8)
    """
    spec = dict(spec)
    class_path = spec.get("class_path")
    init_args = spec.get("init_args") or {}
    unknown = sorted(set(spec) - {"class_path", "init_args"})
    if unknown or not isinstance(class_path, str) or not isinstance(init_args, Mapping):
        raise ValueError(
            "backbone mapping must be {'class_path': 'package.module.Class', 'init_args': "
            f"{{...}}}}; got {spec!r}"
        )
    try:
        cls = _import_class(class_path)
    except ValueError as error:
        raise ValueError(f"backbone: {error}") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"backbone class_path {class_path!r} does not name an nn.Module class")
    return cls(**dict(init_args))


def describe_backbone(backbone: nn.Module) -> dict[str, Any] | None:
    """``{"class_path", "init_args"}`` of a backbone that keeps plain ``init_args``, else None.

    The class must be importable back from its ``class_path`` (not defined in a function).

    Example:
        >>> from lightning_losses.backbones import CNN1D
        >>> describe_backbone(CNN1D(channels=8))
        {'class_path': 'lightning_losses.backbones.CNN1D', 'init_args': {'channels': 8}}
        >>> describe_backbone(nn.Linear(4, 2)) is None  # no init_args: not described
        True
    """
    init_args = getattr(backbone, "init_args", None)
    if not isinstance(init_args, Mapping) or not _is_plain(init_args):
        return None
    cls = type(backbone)
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    try:
        if _import_class(class_path) is not cls:
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
    options = {} if parameter is None else {"device": parameter.device, "dtype": parameter.dtype}
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


def _nll_terms(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Per-term negative log-likelihoods: one per sample, per task (nm) or per label."""
    if task == "multiclass":
        return F.cross_entropy(logits.float(), target, reduction="none")
    if task == "nm":
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none")
    return F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="none")


def _correct_terms(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Per-term hits (bool): top-1 per sample, per task (nm), ``x > 0`` per label otherwise."""
    if task == "multiclass":
        return logits.argmax(dim=1) == target
    if task == "nm":
        return logits.argmax(dim=2) == target
    return (logits > 0) == (target > 0.5)


def task_nll(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Mean negative log-likelihood of the model's probabilities, whatever the loss trained it.

    Softmax cross-entropy for ``multiclass`` and ``nm`` (averaged over tasks), sigmoid binary
    cross-entropy for ``binary`` and ``multilabel`` (averaged over labels).
    """
    return _nll_terms(logits, target, task).mean()


def task_accuracy(logits: Tensor, target: Tensor, task: str) -> Tensor:
    """Accuracy: top-1 (``multiclass``), per task (``nm``), per label with ``x > 0`` otherwise."""
    return _correct_terms(logits, target, task).float().mean()


class MeanOfTerms(Metric):
    """The mean of every term seen, kept as a float64 sum and count summed across processes.

    ``update(values, weight)`` adds ``weight * values.sum()`` to the total and ``weight *
    values.numel()`` to the count; ``compute()`` is ``total / count``. Both states reduce with
    ``dist_reduce_fx="sum"``, so under DDP the value is the mean over the terms of every process,
    however many each holds (a mean of per-process means is not, when the counts differ).

    Example:
        >>> mean = MeanOfTerms()
        >>> mean.update(torch.tensor([1.0, 0.0, 1.0]))  # three terms
        >>> mean.update(torch.tensor(0.5), weight=5)  # a batch mean over five samples
        >>> round(float(mean.compute()), 6)  # (2 + 2.5) / 8
        0.5625
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        zero = torch.zeros((), dtype=torch.float64)
        self.add_state("total", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("count", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, values: Tensor, weight: float = 1.0) -> None:
        """Add ``values`` (any shape), each term counted ``weight`` times."""
        values = values.detach()
        self.total += weight * values.sum(dtype=torch.float64)
        self.count += weight * values.numel()

    def forward(self, values: Tensor, weight: float = 1.0) -> Tensor:
        """:meth:`update`, and return the mean of this batch's terms alone (no collective).

        The value ``torchmetrics``' own ``forward`` gives (for a ``full_state_update=False``
        metric it resets, updates and computes a copy of the state, then merges it back), at
        the cost of one update: it is what Lightning logs each step for a metric logged with
        ``on_step=True``.

        Example:
            >>> from torchmetrics import Metric
            >>> ours, reference = MeanOfTerms(), MeanOfTerms()
            >>> for values in (torch.tensor([0.1, 1.7, 2.9]), torch.tensor([0.3])):
            ...     batch = ours(values, weight=7)
            ...     same = torch.equal(batch, Metric.forward(reference, values, weight=7))
            ...     print(same, torch.equal(ours.total, reference.total))
            True True
            True True
        """
        self.update(values, weight)
        values = values.detach()
        self._forward_cache = (weight * values.sum(dtype=torch.float64)) / (weight * values.numel())
        return self._forward_cache

    def to(self, *args: Any, **kwargs: Any) -> MeanOfTerms:
        """``nn.Module.to``; a move to the states' own device (no dtype) returns at once.

        Lightning moves each logged metric to the logged value's device at every ``self.log``
        call; for states already there that is a no-op, and skipping ``torchmetrics``' walk
        over the states saves about 0.1 ms per call (per step and per validation batch).

        Example:
            >>> mean = MeanOfTerms()
            >>> mean.to("cpu") is mean, mean.total.dtype
            (True, torch.float64)
            >>> mean.to(torch.float32).total.dtype  # a dtype still converts the states
            torch.float32
        """
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None and (device is None or device == self.total.device):
            return self
        return super().to(*args, **kwargs)

    def compute(self) -> Tensor:
        """``total / count`` (NaN before any term)."""
        return self.total / self.count


def _evaluation_metrics() -> nn.ModuleDict:
    return nn.ModuleDict({name: MeanOfTerms() for name in ("loss", "acc", "nll")})


class ClassifierModule(LossMixin, L.LightningModule):
    """A classifier whose backbone, loss, head and optimizer are chosen in YAML.

    The backbone maps inputs ``[N, input_dim]`` to features ``[N, F]``: by default an
    :class:`~lightning_losses.backbones.MLP`, ``Linear -> ReLU (-> Dropout)`` for each size in
    ``hidden`` (``hidden=[]``: none, a logistic regression under a linear head), or any
    ``nn.Module`` given as ``backbone`` (such as the MNIST-1D CNN
    :class:`~lightning_losses.backbones.CNN1D`). The head is a linear layer (logits divided by a
    fixed ``temperature``) or a scaled-cosine :class:`~lightning_losses.NormFaceHead`
    (``normface``, ``cosface``, ``arcface``) on the ``F`` features. The output takes the shape
    the task's losses expect: ``[N, C]`` (``multiclass``), ``[N]`` (``binary``), ``[N, K]``
    (``multilabel``) or ``[N, n, m]`` (``nm``).

    In YAML the backbone is a ``class_path``/``init_args`` mapping::

        model:
          backbone:
            class_path: lightning_losses.backbones.CNN1D
            init_args: {channels: 25}

    (or ``--model.backbone=lightning_losses.backbones.CNN1D`` on the command line).

    Checkpoints keep their hyper-parameters plain (they load with ``weights_only=True``): a
    backbone that keeps its constructor arguments in a plain ``init_args`` dict, as those of
    :mod:`lightning_losses.backbones` do, is stored as ``{"class_path", "init_args"}`` and
    ``load_from_checkpoint(path)`` builds it again. Any other backbone is left out of the
    hyper-parameters: load such a checkpoint with ``load_from_checkpoint(path,
    backbone=<a backbone of the same architecture>)``.

    Logged: ``train/loss``, ``train/acc`` (each step, this process's batch: ``*_step``; and the
    epoch's exact mean over every process's samples: ``*_epoch``),
    ``criterion/<hyper-parameter>`` (each training step, for the values a schedule or switch
    changes; the constants are params), ``time/epoch_seconds`` (the slowest
    process's), and per validation (and test) epoch ``val/loss``, ``val/acc``, ``val/nll``
    (``test/*``). Every value logged on epoch level is reduced across DDP processes, so no
    ``sync_dist`` warning is due. ``validation_step`` returns ``{"loss", "logits", "target"}``
    for the calibration callback.

    The validation and test values are :class:`MeanOfTerms` metrics (one set per stage) whose
    sums are reduced across DDP processes, so with an evaluation loader that gives each sample
    to one process (:class:`~lightning_losses.data.UnpaddedDistributedSampler`, as the
    DataModules of :mod:`lightning_losses.data` do) they are exact over the whole split, however
    many samples each process holds. ``acc`` and ``nll`` are means over terms (samples; per task
    for ``nm``; per label for ``binary`` and ``multilabel``). ``loss`` is the criterion's value
    on each batch weighted by the batch's number of samples: the exact mean over the split for
    criteria whose ``reduction="mean"`` is a mean over samples (or over a fixed number of terms
    per sample); for a class-weighted cross-entropy, which divides each batch by its sum of
    weights, it is the sample-weighted mean of the batch values.

    Args:
        criterion: a registry name (``"focal"``), a loss module, or in YAML a
            ``class_path``/``init_args`` mapping (``lightning_losses.FocalLoss``...).
        input_dim: feature size (linked from the DataModule by the CLI).
        num_classes: classes ``C`` (multiclass), labels ``K`` (multilabel), classes per task
            ``m`` (nm); ignored for binary.
        num_tasks: tasks ``n`` for ``nm``.
        task: ``multiclass``, ``binary``, ``multilabel`` or ``nm``.
        hidden: sizes of the hidden layers of the default MLP backbone.
        dropout: dropout after each hidden layer of the default MLP backbone.
        head: ``linear``, ``normface``, ``cosface`` or ``arcface``.
        temperature: fixed divisor of the linear head's logits.
        scale: scale of a cosine head; ``None`` learns it.
        margin: CosFace / ArcFace margin.
        optimizer: a factory ``params -> Optimizer`` (in YAML a ``class_path`` such as
            ``torch.optim.Adam`` with ``init_args``).
        backbone: ``None`` for ``MLP(input_dim, hidden, dropout)``; an ``nn.Module`` mapping
            ``[N, input_dim]`` to ``[N, F]``; or its ``{"class_path": ..., "init_args":
            {...}}`` mapping (YAML, checkpoints). ``F`` is found by one forward pass of
            ``torch.zeros(2, input_dim)`` in eval mode. ``hidden`` and ``dropout`` describe the
            default MLP only: giving them other values than their defaults together with a
            backbone is an error.

    Raises:
        ValueError: a bad ``task``, ``head``, ``temperature``; a backbone that does not map
            ``[2, input_dim]`` to ``[2, F]``; a backbone together with ``hidden`` or
            ``dropout`` other than their defaults.

    Example:
        >>> model = ClassifierModule("focal", input_dim=64, num_classes=10, hidden=[32])
        >>> model(torch.randn(5, 64)).shape
        torch.Size([5, 10])

        The CNN of MNIST-1D (40 features): ``F = 25 * 5 = 125`` features under the head.

        >>> from lightning_losses.backbones import CNN1D
        >>> model = ClassifierModule("ce", input_dim=40, num_classes=10, backbone=CNN1D(25))
        >>> model.head
        Linear(in_features=125, out_features=10, bias=True)
        >>> model(torch.randn(5, 40)).shape
        torch.Size([5, 10])
        >>> model.hparams["backbone"]
        {'class_path': 'lightning_losses.backbones.CNN1D', 'init_args': {'channels': 25}}
    """

    def __init__(
        self,
        criterion: str | nn.Module = "ce",
        input_dim: int = 64,
        num_classes: int = 10,
        num_tasks: int = 1,
        task: str = "multiclass",
        hidden: Sequence[int] = DEFAULT_HIDDEN,
        dropout: float = DEFAULT_DROPOUT,
        head: str = "linear",
        temperature: float = 1.0,
        scale: float | None = None,
        margin: float = 0.0,
        optimizer: OptimizerFactory | None = None,
        backbone: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}; got {head!r}")
        if head != "linear" and task != "multiclass":
            raise ValueError(f"head={head!r} needs task='multiclass'; got task={task!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be positive; got {temperature!r}")
        if backbone is not None:
            if isinstance(backbone, Mapping):
                backbone = build_backbone(backbone)
            if not isinstance(backbone, nn.Module):
                raise TypeError(
                    "backbone must be None, an nn.Module or a {'class_path', 'init_args'} "
                    f"mapping; got {type(backbone).__name__}"
                )
            if list(hidden) != list(DEFAULT_HIDDEN) or dropout != DEFAULT_DROPOUT:
                raise ValueError(
                    f"hidden and dropout configure the default MLP backbone only; with "
                    f"backbone={type(backbone).__name__} leave them at hidden="
                    f"{list(DEFAULT_HIDDEN)}, dropout={DEFAULT_DROPOUT} (got hidden="
                    f"{list(hidden)}, dropout={dropout}), or give backbone="
                    "lightning_losses.backbones.MLP with those arguments"
                )
        with warnings.catch_warnings():  # a backbone module is replaced by its description
            warnings.filterwarnings("ignore", "Attribute 'backbone' is an instance of `nn.Module`")
            self.save_hyperparameters()
        # Checkpoints must load with torch.load(weights_only=True): keep hparams plain.
        if not _is_plain(self.hparams.get("criterion")):
            self.hparams["criterion"] = describe_criterion(criterion)
        if not _is_plain(self.hparams.get("optimizer")):
            self.hparams.pop("optimizer")
        if not _is_plain(self.hparams.get("backbone")):
            description = describe_backbone(backbone)
            if description is None:  # load_from_checkpoint(path, backbone=...) rebuilds it
                self.hparams.pop("backbone")
            else:
                self.hparams["backbone"] = description
        self.task = task
        self.num_tasks = num_tasks
        self.num_classes = num_classes
        self.temperature = temperature
        self.optimizer_factory = optimizer

        if backbone is None:
            backbone = MLP(input_dim, hidden, dropout)
            width = backbone.out_features
        else:
            width = backbone_features(backbone, input_dim)
        self.backbone = backbone
        outputs = {"multiclass": num_classes, "binary": 1, "multilabel": num_classes}
        outputs["nm"] = num_tasks * num_classes
        if head == "linear":
            self.head: nn.Module = nn.Linear(width, outputs[task])
        else:
            self.head = NormFaceHead(width, num_classes, scale=scale, margin=margin, kind=head)
        self.set_criterion(criterion)
        # One set per stage, so that a test after fit does not mix with validation.
        self.evaluation_metrics = nn.ModuleDict(
            {"val": _evaluation_metrics(), "test": _evaluation_metrics()}
        )
        self.training_metrics = nn.ModuleDict({"loss": MeanOfTerms(), "acc": MeanOfTerms()})
        self._epoch_started = 0.0

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        features = self.backbone(x)
        if isinstance(self.head, NormFaceHead):
            return self.head(features, target)
        logits = self.head(features)
        if self.temperature != 1.0:  # x / 1 is x: no extra op (and autograd node) each step
            logits = logits / self.temperature
        if self.task == "binary":
            return logits.squeeze(-1)
        if self.task == "nm":
            return logits.view(-1, self.num_tasks, self.num_classes)
        return logits

    def _shared_step(self, batch: Sequence[Tensor], stage: str) -> dict[str, Tensor]:
        x, target = batch
        # Margins (CosFace / ArcFace) apply in training only.
        logits = self(x, target if stage == "train" else None)
        loss = self.compute_loss(logits, target, log=stage == "train")
        if stage == "train":
            self._log_training(logits, target, loss)
        else:
            self._log_evaluation(stage, logits, target, loss)
        return self.validation_output(logits, target, loss)

    def _log_training(self, logits: Tensor, target: Tensor, loss: Tensor) -> None:
        """Log the batch's loss and accuracy (this process's) and their exact epoch means.

        Each metric's ``forward`` gives the batch value (``train/loss_step``, ``train/acc_step``:
        no collective per step) and adds the batch to the epoch's sums, which Lightning reduces
        across processes at the epoch's end (``train/loss_epoch``, ``train/acc_epoch``).
        """
        metrics = self.training_metrics
        metrics["loss"](loss, weight=target.shape[0])
        metrics["acc"](_correct_terms(logits, target, self.task))
        for name in ("loss", "acc"):
            self.log(f"train/{name}", metrics[name], on_step=True, on_epoch=True, prog_bar=True)

    def _log_evaluation(self, stage: str, logits: Tensor, target: Tensor, loss: Tensor) -> None:
        """Accumulate the stage's exact means; Lightning syncs their sums at the epoch's end."""
        metrics = self.evaluation_metrics[stage]
        metrics["loss"].update(loss, weight=target.shape[0])
        metrics["acc"].update(_correct_terms(logits, target, self.task))
        metrics["nll"].update(_nll_terms(logits, target, self.task))
        for name, prog_bar in (("loss", True), ("acc", True), ("nll", False)):
            self.log(
                f"{stage}/{name}", metrics[name], on_step=False, on_epoch=True, prog_bar=prog_bar
            )

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train")["loss"]

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._shared_step(batch, "val")

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._shared_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Probabilities: softmax (multiclass, nm) or sigmoid (binary, multilabel)."""
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        logits = self(x)
        if self.task in ("multiclass", "nm"):
            return torch.softmax(logits, dim=-1)
        return torch.sigmoid(logits)

    def on_train_start(self) -> None:
        # A fit resumed inside an epoch gets no on_train_epoch_start for it: count from here.
        self._epoch_started = time.perf_counter()

    def on_train_epoch_start(self) -> None:
        self._epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        # The slowest process's time is the epoch's (one reduction per epoch under DDP).
        seconds = time.perf_counter() - self._epoch_started
        self.log("time/epoch_seconds", seconds, sync_dist=True, reduce_fx="max")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        factory = self.optimizer_factory
        if factory is None:
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        if isinstance(factory, Mapping):  # a class_path mapping restored from a checkpoint
            cls = _import_class(factory["class_path"])
            return cls(self.parameters(), **dict(factory.get("init_args") or {}))
        return factory(self.parameters())
