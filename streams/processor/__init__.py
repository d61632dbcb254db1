"""The partition processor: read -> apply -> ONE write batch -> then actions."""

from conveyor.streams.processor.loop import PartitionProcessor

__all__ = ["PartitionProcessor"]
