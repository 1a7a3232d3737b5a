"""Prefetch: the pure per-handle window policy (policy.py) and the two-lane
worker pool that runs block fetches, demand before prefetch (scheduler.py)."""

from datamount.prefetch.policy import PrefetchPolicy
from datamount.prefetch.scheduler import Scheduler, SchedulerClosed, Ticket

__all__ = ["PrefetchPolicy", "Scheduler", "SchedulerClosed", "Ticket"]
