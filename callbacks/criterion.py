"""Where the callbacks find the loss: one attribute of the LightningModule, ``criterion``.

Every callback that reads or replaces the module's loss
(:class:`~lightning_losses.callbacks.LossScheduler`,
:class:`~lightning_losses.callbacks.GammaAnnealing`,
:class:`~lightning_losses.callbacks.LossSwitch`,
:class:`~lightning_losses.callbacks.AdaFocalUpdate`) takes ``attribute=`` (default
``"criterion"``, the attribute :class:`~lightning_losses.lightning.mixin.LossMixin` gives), and
looks it up here, so a module that keeps its loss as ``self.loss_fn`` works with
``attribute="loss_fn"`` and a missing one fails with one message naming the attribute, the
module, the callback and the attributes that do hold a loss.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = [
    "DEFAULT_ATTRIBUTE",
    "attribute_name",
    "loss_attributes",
    "missing_message",
    "module_criterion",
    "set_module_criterion",
]

#: The attribute a callback reads the loss from unless told otherwise (``LossMixin``'s).
DEFAULT_ATTRIBUTE = "criterion"


def attribute_name(attribute: Any, owner: str) -> str:
    """``attribute`` if it is an identifier, else a ``ValueError`` naming ``owner``'s argument.

    Example:
        >>> attribute_name("loss_fn", "GammaAnnealing")
        'loss_fn'
        >>> attribute_name("loss fn", "GammaAnnealing")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: GammaAnnealing(attribute='loss fn'): attribute must name the ... 'loss_fn'
    """
    if not isinstance(attribute, str) or not attribute.isidentifier():
        raise ValueError(
            f"{owner}(attribute={attribute!r}): attribute must name the LightningModule's "
            "attribute that holds the loss, e.g. 'criterion' or 'loss_fn'"
        )
    return attribute


def loss_attributes(pl_module: Any) -> list[str]:
    """The module's attributes that hold a loss: its submodules that are loss modules.

    A loss module is a ``torch.nn`` loss (``nn.modules.loss._Loss``), a module whose class name
    ends in ``Loss``, or one with a ``hyperparameters()`` method (this package's losses).

    Example:
        >>> import lightning as L
        >>> from lightning_losses import FocalLoss
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = nn.Linear(2, 2)
        ...         self.loss_fn = FocalLoss()
        >>> loss_attributes(Model())
        ['loss_fn']
    """
    names = []
    for name, child in getattr(pl_module, "named_children", lambda: iter(()))():
        cls = type(child)
        if (
            isinstance(child, nn.modules.loss._Loss)
            or cls.__name__.endswith("Loss")
            or callable(getattr(child, "hyperparameters", None))
        ):
            names.append(name)
    return names


def module_criterion(pl_module: Any, attribute: str, owner: str) -> Any:
    """``getattr(pl_module, attribute)``: the loss a callback reads; ``ValueError`` if absent.

    Args:
        pl_module: the LightningModule.
        attribute: the attribute that holds its loss (``"criterion"`` by default).
        owner: the callback, as the message names it (``"GammaAnnealing"``).

    Raises:
        ValueError: the module has no such attribute, or it is ``None``; the message names the
            attribute, the module, the callback and the attributes that hold a loss.

    Example:
        >>> import lightning as L
        >>> class Model(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.loss_fn = nn.CrossEntropyLoss()
        >>> module_criterion(Model(), "loss_fn", "GammaAnnealing")
        CrossEntropyLoss()
        >>> module_criterion(Model(), "criterion", "GammaAnnealing")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: GammaAnnealing(attribute='criterion'): Model has no ... attribute='loss_fn'
    """
    criterion = getattr(pl_module, attribute, None)
    if criterion is not None:
        return criterion
    raise ValueError(missing_message(pl_module, attribute, owner))


def missing_message(pl_module: Any, attribute: str, owner: str) -> str:
    """The one message for a module without the loss attribute a callback reads."""
    where = f"{owner}(attribute={attribute!r}): {type(pl_module).__name__} has no attribute "
    found = [name for name in loss_attributes(pl_module) if name != attribute]
    if len(found) == 1:
        hint = f"its loss is in {found[0]}: pass attribute={found[0]!r}"
    elif found:
        hint = f"its losses are in {', '.join(found)}: pass attribute= one of them"
    else:
        hint = (
            "keep the loss module in an attribute (self.criterion = FocalLoss(), or "
            "lightning_losses.LossMixin's self.set_criterion(...)) and compute the loss with "
            "it, then pass that attribute's name as attribute="
        )
    return f"{where}{attribute!r} holding its loss; {hint}"


def set_module_criterion(pl_module: Any, attribute: str, criterion: Any) -> None:
    """Set ``pl_module.<attribute> = criterion`` (a module replaces the submodule there).

    A plain callable may replace a module there (``nn.Module`` would refuse to assign it to a
    submodule's name): the submodule is removed first.
    """
    if not isinstance(criterion, nn.Module) and isinstance(
        getattr(pl_module, attribute, None), nn.Module
    ):
        delattr(pl_module, attribute)
    setattr(pl_module, attribute, criterion)
