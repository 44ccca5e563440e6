"""The ``distributed`` section is defined once: the core's spec and the runtime use one class."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from trainhub.core.distributed_spec import STRATEGY_CONFIGS, DistributedSpec, Strategy
from trainhub.runtime.distributed.config import ENV_DISTRIBUTED, DistributedConfig
from trainhub.runtime.protocol import ENV_DISTRIBUTED as PROTOCOL_ENV

EXAMPLES: list[dict[str, Any]] = [
    {},
    {"strategy": "fp16", "bucket_cap_mb": 4},
    {"strategy": "powersgd", "powersgd": {"rank": 4, "start_step": 20, "warm_start": False}},
    {"strategy": "onebit", "onebit": {"start_step": 3, "error_feedback": False}},
    {"strategy": "topk", "topk": {"density": 0.001, "warmup_steps": 0}},
    {"strategy": "localsgd", "localsgd": {"period": 16, "start_step": 0}},
    {"strategy": "ps", "ps": {"num_shards": 4, "consistency": "ssp", "staleness": 3}},
    {"strategy": "ps", "large_batch": {"optimizer": "adamw"}},
    {
        "large_batch": {
            "accumulation_steps": 8,
            "lr_scaling": "linear",
            "reference_batch_size": 128,
            "warmup_steps": 500,
            "optimizer": "lars",
        },
        "memory": {"precision": "bf16", "activation_checkpointing": True, "fsdp": True},
    },
]

INVALID: list[dict[str, Any]] = [
    {"strategy": "ring"},
    {"bucket_cap_mb": 0},
    {"bucket_cap_mb": 2048},
    {"powersgd": {"rank": 0}},
    {"powersgd": {"start_step": 1}},  # error feedback needs >= 2
    {"topk": {"density": 0.0}},
    {"topk": {"density": 1.5}},
    {"topk": {"start_step": 0}},
    {"onebit": {"start_step": 0}},
    {"localsgd": {"period": 1}},
    {"ps": {"num_shards": 0}},
    {"ps": {"consistency": "eventual"}},
    {"ps": {"staleness": -1}},
    {"large_batch": {"accumulation_steps": 0}},
    {"large_batch": {"optimizer": "adagrad"}},
    {"memory": {"precision": "fp8"}},
    {"memory": {"fsdp": True}, "strategy": "topk"},
    {"strategy": "ps", "large_batch": {"optimizer": "lamb"}},
    {"strategy": "ps", "ps": {"cpus_per_shard": 1}},  # shards run inside the ranks now
    {"topk": {"densty": 0.1}},  # unknown field
    {"unknown": 1},
]


def test_core_and_runtime_use_the_same_class() -> None:
    assert DistributedSpec is DistributedConfig
    assert DistributedSpec().model_dump(mode="json") == DistributedConfig().to_dict()


def test_every_strategy_has_one_registered_class_with_its_own_config() -> None:
    from trainhub.runtime.distributed.strategies import COMM_STRATEGIES, BuiltinCommStrategy
    from trainhub.runtime.model import BaseCommStrategy

    assert set(COMM_STRATEGIES) == set(STRATEGY_CONFIGS) == {s.value for s in Strategy}
    for name, cls in COMM_STRATEGIES.items():
        assert issubclass(cls, BuiltinCommStrategy)
        assert issubclass(cls, BaseCommStrategy)
        assert cls.name == name
        section = DistributedConfig.from_mapping({"strategy": name})
        key = STRATEGY_CONFIGS[name]
        assert section.strategy_config is (None if key is None else getattr(section, key))


@pytest.mark.parametrize("section", EXAMPLES)
def test_the_spec_json_round_trips_into_the_runtime_config(section: dict[str, Any]) -> None:
    spec = DistributedSpec.model_validate(section)
    config = DistributedConfig.from_json(spec.model_dump_json())
    assert config.to_dict() == spec.model_dump(mode="json")
    # and the runtime reads the raw section the same way the spec does
    assert DistributedConfig.from_mapping(section) == config


@pytest.mark.parametrize("section", INVALID)
def test_both_reject_the_same_mistakes(section: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DistributedSpec.model_validate(section)
    with pytest.raises(ValueError, match=r"^distributed\."):
        DistributedConfig.from_mapping(section)


def test_runtime_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"distributed\.topk\.densty: unknown field"):
        DistributedConfig.from_mapping({"topk": {"densty": 0.1}})
    with pytest.raises(ValueError, match=r"distributed\.ps\.consistency: must be one of"):
        DistributedConfig.from_mapping({"ps": {"consistency": "eventual"}})


def test_from_env_reads_the_protocol_variable() -> None:
    assert ENV_DISTRIBUTED == PROTOCOL_ENV
    section = {"strategy": "topk", "topk": {"density": 0.1}}
    config = DistributedConfig.from_env({ENV_DISTRIBUTED: json.dumps(section)})
    assert config.strategy == "topk"
    assert config.topk.density == 0.1
    assert DistributedConfig.from_env({}) == DistributedConfig()
    assert DistributedConfig.from_env({ENV_DISTRIBUTED: "null"}) == DistributedConfig()


def test_reading_the_config_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from trainhub.runtime.distributed.config import DistributedConfig; "
        "DistributedConfig(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
