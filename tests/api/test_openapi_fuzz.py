"""schemathesis over the OpenAPI schema, as a member and without a token: no server error, no
status code the schema does not document, no answer that breaks its schema."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.api.conftest import build_bounded_api
from tests.api.test_auth import submit
from tests.api.trials import start_attempt
from tests.fixtures.api import Api

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
# bounded: ~25 operations x 2 callers x this many examples stays well under a minute
MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, str]]:
    api = build_bounded_api(Path(tmp_path_factory.mktemp("fuzz")))
    with api.client:
        member = api.user("fuzzer", "vision")
        for _ in range(2):
            trial_id = submit(api, member).json()["trials"][0]["id"]
        start_attempt(api, trial_id)
        yield api, member
    api.services.uow.engine.dispose()  # type: ignore[attr-defined]


def _fuzz(api: Api, token: str | None) -> tuple[list[str], Counter[int]]:
    """Run every operation's generated cases; return the failures (one line each) and how
    often each status code was answered."""
    # the schema's request gets schemathesis' default 10 s: a loaded machine took longer
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", api.client.app, timeout=120)
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case: schemathesis.Case) -> None:
            headers = {
                k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"
            }
            if token:
                headers["Authorization"] = f"Bearer {token}"
            case.headers = headers
            response = case.call_and_validate(checks=CHECKS)
            statuses[response.status_code] += 1

        try:
            run()
        except Exception as exc:
            failures.append(f"{operation.label}: {str(exc)[:600]}")
    return failures, statuses


def test_api_conforms_to_its_schema_as_a_member(fuzzed: tuple[Api, str]) -> None:
    api, member = fuzzed
    failures, statuses = _fuzz(api, member)
    assert not failures, "\n\n".join(failures)
    # the cases reached the routes: successes and refusals of every kind, no error
    assert sum(n for s, n in statuses.items() if s < 300) >= 50, statuses
    assert {403, 404, 422} <= set(statuses), statuses


def test_api_conforms_to_its_schema_without_a_token(fuzzed: tuple[Api, str]) -> None:
    api, _ = fuzzed
    failures, statuses = _fuzz(api, None)
    assert not failures, "\n\n".join(failures)
    assert set(statuses) <= {401, 413, 411}, statuses
    assert statuses[401] >= 100, statuses
