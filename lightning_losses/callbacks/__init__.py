"""Schedules and callbacks for lightning-losses (installed as ``lightning_losses.callbacks``)."""

from .adafocal import AdaFocalUpdate
from .calibration import CalibrationMonitor, TemperatureScalingCallback
from .checkpoint import LastCheckpoint
from .curves import SplitCurves
from .loss_scheduler import GammaAnnealing, LossScheduler
from .loss_switch import LossSwitch
from .outputs import OutputAdapter
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
    "LastCheckpoint",
    "LinearSchedule",
    "LossScheduler",
    "LossSwitch",
    "OutputAdapter",
    "Schedule",
    "SplitCurves",
    "StepSchedule",
    "TemperatureScalingCallback",
]
