"""Prefetch: the pure per-handle window policy (policy.py) and the two-lane
worker pool that runs block fetches, demand before prefetch (scheduler.py)."""

from datamount.read.prefetch.policy import PrefetchPolicy
from datamount.read.prefetch.scheduler import Scheduler, SchedulerClosed, Ticket

__all__ = ["PrefetchPolicy", "Scheduler", "SchedulerClosed", "Ticket"]
