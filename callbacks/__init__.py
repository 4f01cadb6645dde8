"""Schedules and callbacks for lightning-losses (installed as ``lightning_losses.callbacks``)."""
