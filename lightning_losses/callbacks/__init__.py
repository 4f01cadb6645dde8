"""Schedules and callbacks for lightning-losses (installed as ``lightning_losses.callbacks``)."""

from .adafocal import AdaFocalUpdate
from .calibration import CalibrationMonitor, TemperatureScalingCallback
from .curves import SplitCurves
from .loss_scheduler import GammaAnnealing, LossScheduler
from .loss_switch import LossSwitch
from .schedules import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    IntervalSchedule,
    LinearSchedule,
    Schedule,
    StepSchedule,
)

__all__ = [
    "AdaFocalUpdate",
    "CalibrationMonitor",
    "ConstantSchedule",
    "CosineSchedule",
    "ExponentialSchedule",
    "GammaAnnealing",
    "IntervalSchedule",
    "LinearSchedule",
    "LossScheduler",
    "LossSwitch",
    "Schedule",
    "SplitCurves",
    "StepSchedule",
    "TemperatureScalingCallback",
]
