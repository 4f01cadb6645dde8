"""Schedules and callbacks for lightning-losses (installed as ``lightning_losses.callbacks``)."""

from lightning_losses.callbacks.adafocal import AdaFocalUpdate
from lightning_losses.callbacks.calibration import CalibrationMonitor
from lightning_losses.callbacks.checkpoint import LastCheckpoint
from lightning_losses.callbacks.conformal import ConformalPrediction
from lightning_losses.callbacks.curves import SplitCurves
from lightning_losses.callbacks.loss_scheduler import GammaAnnealing, LossScheduler
from lightning_losses.callbacks.loss_switch import LossSwitch
from lightning_losses.callbacks.outputs import OutputAdapter
from lightning_losses.callbacks.posthoc import PostHocCalibration
from lightning_losses.callbacks.schedules import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    IntervalSchedule,
    LinearSchedule,
    Schedule,
    StepSchedule,
)
from lightning_losses.callbacks.temperature_scaling import TemperatureScalingCallback

__all__ = [
    "AdaFocalUpdate",
    "CalibrationMonitor",
    "ConformalPrediction",
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
    "PostHocCalibration",
    "Schedule",
    "SplitCurves",
    "StepSchedule",
    "TemperatureScalingCallback",
]
