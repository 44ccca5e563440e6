"""Scheduling policies: pure functions from a snapshot to decisions."""

from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import (
    Decision,
    DecisionList,
    Pending,
    Preempt,
    Start,
    split_decisions,
)
from trainhub.core.scheduling.factory import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    create_policy,
    policy_help,
)
from trainhub.core.scheduling.fair import FairSharePolicy
from trainhub.core.scheduling.fair_config import FairShareConfig
from trainhub.core.scheduling.fifo import FifoPolicy
from trainhub.core.scheduling.las import LasConfig, LeastAttainedServicePolicy
from trainhub.core.scheduling.queue import SUBMISSION_ORDER, QueueIndex, QueueOrder, TrialQueue
from trainhub.core.scheduling.sjf import ShortestJobFirstPolicy
from trainhub.core.scheduling.snapshot import QueuedTrial, RunningTrial, Snapshot, TenantShare

__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "SUBMISSION_ORDER",
    "BasePolicy",
    "Decision",
    "DecisionList",
    "FairShareConfig",
    "FairSharePolicy",
    "FifoPolicy",
    "LasConfig",
    "LeastAttainedServicePolicy",
    "Pending",
    "Preempt",
    "QueueIndex",
    "QueueOrder",
    "QueuedTrial",
    "RunningTrial",
    "ShortestJobFirstPolicy",
    "Snapshot",
    "Start",
    "TenantShare",
    "TrialQueue",
    "create_policy",
    "policy_help",
    "split_decisions",
]
