"""Strategy ``ps``: parameter shards as Ray actors; workers push gradients and pull weights.

See :mod:`.shard` for the consistency models (sync, async, stale-synchronous), :mod:`.client`
for the worker side, :mod:`.actors` for the Ray plumbing.
"""
