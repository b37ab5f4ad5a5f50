"""Rescale: change the number of state partitions of an existing checkpoint (docs/RESCALE.md)."""

from blobstate.rescale.job import STEPS, RescalePlan, RescaleResult, plan_rescale, rescale_checkpoint
from blobstate.rescale.split import RescaleError

__all__ = ["STEPS", "RescaleError", "RescalePlan", "RescaleResult", "plan_rescale", "rescale_checkpoint"]
