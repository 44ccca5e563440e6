"""Failures that will always repeat are not retried (core/failures.py), with plain values."""

from __future__ import annotations

from trainhub.core.failures import (
    FailureFacts,
    error_line,
    import_problem,
    judge_failure,
    signature,
)

MISSING = """Traceback (most recent call last):
  File "/tmp/trainhub-ctx-8f3a/train.py", line 3, in <module>
    import sklearnx
ModuleNotFoundError: No module named 'sklearnx'
"""
MISSING_AGAIN = MISSING.replace("8f3a", "1c22")
AT_IMPORT = """Traceback (most recent call last):
  File "train.py", line 2, in <module>
    from helpers import build
  File "/work/helpers.py", line 5, in <module>
    torch.compiler.foo()
AttributeError: module 'torch.compiler' has no attribute 'foo'
"""
AT_RUN = """Traceback (most recent call last):
  File "train.py", line 40, in <module>
    model.fit()
AttributeError: 'Net' object has no attribute 'fit'
"""
OOM_AT_STEP = "step 7\nRuntimeError: CUDA out of memory at 0x7f00aa (tried 2048 MiB)\n"


def facts(tail: str, code: int | None = 1, reported: bool = False) -> FailureFacts:
    return FailureFacts(code, tail, reported)


def test_the_error_line_is_the_tracebacks_last_line() -> None:
    assert error_line(MISSING) == "ModuleNotFoundError: No module named 'sklearnx'"
    assert error_line("warming up\nsome words\n\n") == "some words"
    assert error_line("") == ""


def test_the_signature_blanks_what_changes_between_runs() -> None:
    assert signature(facts(OOM_AT_STEP)) == signature(
        facts(OOM_AT_STEP.replace("0x7f00aa", "0x51").replace("2048", "1024"))
    )
    assert signature(facts(MISSING)) != signature(facts(MISSING, code=2))
    assert signature(facts(MISSING)) != signature(facts(AT_RUN))


def test_an_import_error_names_the_module_and_the_docs() -> None:
    said = import_problem(MISSING)
    assert said is not None
    assert "module 'sklearnx' is not installed" in said
    assert "docs/environments.md" in said
    cannot = import_problem("ImportError: cannot import name 'foo' from 'bar' (/x/bar.py)")
    assert cannot is not None
    assert "'foo' cannot be imported from module 'bar'" in cannot


def test_an_attribute_error_counts_only_when_raised_by_an_import() -> None:
    said = import_problem(AT_IMPORT)
    assert said is not None
    assert "module 'torch.compiler' has no 'foo'" in said
    assert import_problem(AT_RUN) is None
    assert import_problem(OOM_AT_STEP) is None


def test_the_first_failure_is_retried_and_explained() -> None:
    verdict = judge_failure(facts(MISSING), None)
    assert verdict.retry
    assert "sklearnx" in verdict.note


def test_the_same_failure_twice_before_a_report_is_not_retried() -> None:
    verdict = judge_failure(facts(MISSING_AGAIN), facts(MISSING))
    assert not verdict.retry
    assert "failed the same way twice before training started" in verdict.note
    assert "sklearnx" in verdict.note


def test_a_different_failure_or_one_after_reports_is_retried() -> None:
    assert judge_failure(facts(AT_RUN), facts(MISSING)).retry
    assert judge_failure(facts(OOM_AT_STEP, reported=True), facts(OOM_AT_STEP)).retry
    assert judge_failure(facts(OOM_AT_STEP), facts(OOM_AT_STEP, reported=True)).retry


def test_a_program_that_cannot_be_executed_is_not_retried() -> None:
    for code in (126, 127):
        tail = "setpriv: failed to execute python: No such file or directory\n"
        verdict = judge_failure(facts(tail, code=code), None)
        assert not verdict.retry
        assert "cannot be executed" in verdict.note
        assert f"exit code {code}" in verdict.note
    assert judge_failure(facts("boom", code=1), None).retry
