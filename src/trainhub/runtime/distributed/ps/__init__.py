"""Strategy ``ps``: parameter shards served by the trial's own ranks; workers push gradients
and pull weights.

See :mod:`.shard` for the consistency models (sync, async, stale-synchronous) and optimizers,
:mod:`.server` for how a rank serves its shards over TCP, :mod:`.client` for the worker side.
"""
