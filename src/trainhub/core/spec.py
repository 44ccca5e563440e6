"""The experiment spec: the user's contract, as pydantic models.

A spec is YAML. :func:`parse_spec` turns its text into an :class:`ExperimentSpec` or raises
:class:`~trainhub.core.errors.InvalidSpec` listing every problem with its field path and a hint.
Field descriptions here generate the reference docs and the OpenAPI schema.
"""

from __future__ import annotations

import re
import shlex
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainhub.core import limits
from trainhub.core.dataset_spec import DataMount, bracket_paths
from trainhub.core.distill_spec import DistillSpec
from trainhub.core.distributed_spec import DistributedSpec
from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.federated_spec import FederatedSpec, JobKind, federated_errors
from trainhub.core.model_spec import ModelSpec
from trainhub.core.search_space import SearchSpace, parse_space
from trainhub.core.searcher_spec import SearcherSpec, searcher_errors
from trainhub.core.session_spec import SessionSpec
from trainhub.core.spec_errors import field_errors_from_pydantic
from trainhub.core.spec_yaml import load_yaml

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
HyperparameterValue = str | int | float | bool | None | list[Any]
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_Label = Annotated[str, Field(max_length=limits.MAX_LABEL_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Placement(StrEnum):
    PACK = "pack"  # fewest nodes
    SPREAD = "spread"  # one rank per node where possible


class Priority(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"  # admins only

    @property
    def rank(self) -> int:
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2, Priority.URGENT: 3}


class TopologyLevel(StrEnum):
    RACK = "rack"
    BLOCK = "block"


class Topology(_Strict):
    """Where a gang's ranks sit in the cluster's racks and blocks (docs/scheduler.md):
    ``{required: rack}`` keeps them in one rack (the gang waits for one); ``{preferred: rack}``
    asks for one rack when one has room now, else runs where it fits."""

    required: TopologyLevel | None = Field(
        None, description="All ranks in one domain of this level (rack or block)."
    )
    preferred: TopologyLevel | None = Field(
        None, description="All ranks in one domain of this level when one fits now."
    )

    @field_validator("preferred")
    @classmethod
    def _one_of(cls, value: TopologyLevel | None, info: Any) -> TopologyLevel | None:
        if value is not None and info.data.get("required") is not None:
            raise ValueError("give required or preferred, not both")
        return value


class Resources(_Strict):
    """What one trial needs: ``workers`` ranks, each with these devices."""

    workers: Annotated[int, Field(ge=1, le=4096, description="Number of ranks (processes).")] = 1
    gpus_per_worker: Annotated[
        int, Field(ge=0, le=16, description="GPUs per rank; 0 runs on CPU with gloo.")
    ] = 0
    cpus_per_worker: Annotated[
        float,
        Field(
            ge=limits.MIN_CPUS_PER_WORKER,
            le=512,
            description="CPU cores reserved per rank (at least 0.01).",
        ),
    ] = 1.0
    memory_gb_per_worker: Annotated[
        float | None,
        Field(
            gt=0,
            le=limits.MAX_MEMORY_GB_PER_WORKER,
            description="Host memory reserved per rank, in GB.",
        ),
    ] = None
    placement: Placement = Field(
        Placement.PACK, description="pack: fewest nodes; spread: ranks on different nodes."
    )
    single_node: bool = Field(False, description="All ranks must share one node.")
    pin_cpus: bool = Field(
        False,
        description="Pin each rank to round(cpus_per_worker) whole cores of its own (cpuset); "
        "without it a rank gets cpus_per_worker of CPU time on any core.",
    )
    node_labels: dict[_Label, _Label] = Field(
        default_factory=dict,
        max_length=limits.MAX_NODE_LABELS,
        description="Only nodes with these labels qualify, e.g. {gpu_model: A100}.",
    )
    topology: Topology | None = Field(
        None,
        description="Keep the ranks in one rack or block: {required: rack} or {preferred: rack}.",
    )


class CheckpointPolicy(_Strict):
    keep_latest: Annotated[int, Field(ge=0, le=1000)] = 1
    keep_best: Annotated[int, Field(ge=0, le=1000, description="Ranked by searcher.metric.")] = 0


class PreemptionPolicy(_Strict):
    """How the scheduler stops this experiment's trials when it takes their resources back."""

    grace_s: Annotated[
        float,
        Field(
            ge=0,
            le=3600,
            description="Seconds between SIGTERM to the script's process group and SIGKILL of "
            "the whole tree; a plain script saves its checkpoint in this time.",
        ),
    ] = 60.0
    preemptible: bool = Field(
        True, description="The scheduler may preempt these trials to serve other tenants."
    )


class Environment(_Strict):
    variables: dict[str, str] = Field(
        default_factory=dict,
        max_length=limits.MAX_ENV_VARIABLES,
        description="Extra environment variables for every rank: names of letters, digits "
        "and '_' (not starting with a digit); values without NUL bytes.",
    )

    @field_validator("variables")
    @classmethod
    def _exportable(cls, value: dict[str, str]) -> dict[str, str]:
        for name, item in value.items():
            if len(name) > limits.MAX_ENV_NAME_CHARS or not ENV_NAME.match(name):
                raise ValueError(
                    f"{name[:64]!r} is not a valid environment variable name: use letters, "
                    f"digits and '_', not starting with a digit, at most "
                    f"{limits.MAX_ENV_NAME_CHARS} characters"
                )
            if "\x00" in item:
                raise ValueError(f"the value of {name} contains a NUL byte")
            if len(item) > limits.MAX_ENV_VALUE_CHARS:
                raise ValueError(
                    f"the value of {name} is {len(item)} characters; the limit is "
                    f"{limits.MAX_ENV_VALUE_CHARS}"
                )
        return value

    # a Python environment of the experiment's own packages (docs/environments.md)
    requirements: str | None = Field(
        None,
        min_length=1,
        max_length=limits.MAX_REQUIREMENTS_PATH_CHARS,
        description="A requirements file of the submitted code (path relative to it), "
        "installed into an environment layered over the platform's (torch and trainhub are "
        "the platform's own).",
    )
    packages: list[Annotated[str, Field(min_length=1, max_length=limits.MAX_REQUIREMENT_CHARS)]] = (
        Field(
            default_factory=list,
            max_length=limits.MAX_REQUIREMENTS,
            description="Packages to install, as pip writes them (einops==0.8.1), instead of or "
            "beside a requirements file.",
        )
    )

    @field_validator("requirements")
    @classmethod
    def _relative_file(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = value.replace("\\", "/").split("/")
        if value.startswith("/") or ".." in parts or "\x00" in value:
            raise ValueError(
                f"{value[:64]!r} must be a path inside the submitted code, relative to it "
                "(e.g. requirements.txt)"
            )
        return value[2:] if value.startswith("./") else value

    @property
    def wants_packages(self) -> bool:
        """Whether trials need an environment of their own (else: the platform's)."""
        return bool(self.requirements or self.packages)


class ExperimentSpec(_Strict):
    """An experiment: what to run, on what, with which hyperparameters."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Short name, e.g. mnist-lenet.")
    project: str = Field("default", pattern=NAME_PATTERN)
    description: str = Field("", max_length=limits.MAX_DESCRIPTION_CHARS)
    kind: JobKind = Field(
        JobKind.TRAINING,
        description="training: the entrypoint on every rank; federated: a Flower server and "
        "clients as one trial (the federated section, docs/federated.md).",
    )
    entrypoint: str = Field(
        ...,
        min_length=1,
        max_length=limits.MAX_ENTRYPOINT_CHARS,
        description="Command run in the context directory, e.g. 'python train.py --epochs 5'.",
    )
    resources: Resources = Field(default_factory=Resources)
    priority: Priority = Priority.NORMAL
    hyperparameters: dict[str, Any] = Field(
        default_factory=dict,
        max_length=limits.MAX_HYPERPARAMETERS,
        description="Handed to the script as ctx.hparams: constants, or distributions a searcher "
        "picks from (docs/search.md).",
    )
    searcher: SearcherSpec = Field(default_factory=SearcherSpec)
    checkpoints: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    environment: Environment = Field(default_factory=Environment)
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec,
        description="How ranks cooperate: communication strategy, precision, memory savings.",
    )
    model: ModelSpec = Field(
        default_factory=ModelSpec,
        description="Start from a registered model or a trial; freeze, reset, grow "
        "(docs/models.md).",
    )
    distill: DistillSpec | None = Field(
        None,
        description="Train the script's model as a student of a teacher model: soft targets "
        "and FitNet hints (docs/models.md).",
    )
    data: list[DataMount] = Field(
        default_factory=list,
        max_length=limits.MAX_DATA_MOUNTS,
        description="Tenant datasets the trial reads, read-only, each at its mount path "
        "(trainhub data push; docs/data.md).",
    )
    session: SessionSpec | None = Field(
        None,
        description="An interactive session (notebook, shell, tensorboard) instead of a "
        "training run; written by trainhub notebook and the dashboard (docs/sessions.md).",
    )
    federated: FederatedSpec | None = Field(
        None,
        description="With kind: federated: the Flower federation the trial runs (clients, "
        "rounds, strategy, the partition of a data set; docs/federated.md).",
    )

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_parses(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("contains a NUL byte; a command line cannot hold one")
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments: {exc}") from None
        if not argv:
            raise ValueError("is empty")
        return value

    @property
    def search_space(self) -> SearchSpace:
        return parse_space(self.hyperparameters)

    @property
    def entrypoint_argv(self) -> list[str]:
        return shlex.split(self.entrypoint)


_PYTHON_SWITCHES = frozenset({"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "--standalone"})


def entrypoint_script(entrypoint: str) -> str | None:
    """The file in the context that ``entrypoint`` runs, if it names one.

    ``python train.py``, ``python -u src/train.py``, ``torchrun --nproc-per-node 2 train.py`` and
    ``./run.sh`` name a file; ``python -m pkg.train`` and ``bash -c ...`` do not.
    """
    argv = shlex.split(entrypoint)
    if not argv:
        return None
    head = argv[0].rsplit("/", 1)[-1]
    if head.startswith("python") or head == "torchrun":
        rest = argv[1:]
        while rest:
            token = rest.pop(0)
            if token in ("-m", "-c"):
                return None
            if token.startswith("-"):
                # flags with a separate value (torchrun --nproc-per-node 2, python -W x)
                takes_value = "=" not in token and token not in _PYTHON_SWITCHES
                if takes_value and rest and not rest[0].endswith(".py"):
                    rest.pop(0)
                continue
            return token
        return None
    if argv[0].endswith((".py", ".sh")):
        return argv[0]
    return None


def check_entrypoint_exists(spec: ExperimentSpec, files: set[str]) -> None:
    """Raise InvalidSpec when the entrypoint names a file the context does not hold."""
    script = entrypoint_script(spec.entrypoint)
    if script is None:
        return
    normalized = script[2:] if script.startswith("./") else script
    if normalized not in files:
        raise InvalidSpec(
            [
                FieldError(
                    "entrypoint",
                    f"the file {script!r} is not in the code context",
                    "submit the directory that contains it (trainhub submit SPEC -C DIR), or "
                    "fix the path relative to that directory",
                )
            ]
        )


def parse_spec(text: str) -> ExperimentSpec:
    """Parse a YAML spec; raise InvalidSpec with field paths (and YAML line numbers).

    The text is checked against the bounds of :mod:`trainhub.core.limits` (size, nesting,
    alias expansion, integer length) before the document is built.
    """
    return validate_spec(load_yaml(text))


def layout_errors(spec: ExperimentSpec) -> list[FieldError]:
    """The world (``resources.workers``) must factor into data x pipeline stages x tensor."""
    problem = spec.distributed.layout_error(spec.resources.workers)
    if problem is None:
        return []
    field, message = problem
    size = spec.distributed.model_parallel_size
    return [
        FieldError(
            f"distributed.{field}",
            message,
            f"set resources.workers to a multiple of {size} (e.g. {size}), or change "
            f"distributed.{field}",
        )
    ]


def validate_spec(data: Any) -> ExperimentSpec:
    if not isinstance(data, dict):
        raise InvalidSpec(
            [
                FieldError(
                    "",
                    f"the spec must be a mapping of fields, got {type(data).__name__}",
                    "start from examples/mnist/experiment.yaml",
                )
            ]
        )
    plain = limits.check_plain_values(data)
    if plain:
        raise InvalidSpec(plain)
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        errors = bracket_paths(field_errors_from_pydantic(exc, ExperimentSpec))
        raise InvalidSpec(errors) from None
    errors = searcher_errors(spec.searcher, spec.search_space)  # raises on a bad space
    resources = data.get("resources")
    workers_given = isinstance(resources, dict) and "workers" in resources
    errors += federated_errors(
        spec.kind,
        spec.federated,
        spec.resources.workers,
        workers_given,
        [d.name for d in spec.data],
    )
    errors += layout_errors(spec)
    if errors:
        raise InvalidSpec(errors)
    if spec.federated is not None:  # the server and the clients: one rank each
        ranks = spec.federated.clients + 1
        resources = spec.resources.model_copy(update={"workers": ranks})
        spec = spec.model_copy(update={"resources": resources})
    return spec
