"""Failures that will always repeat: which failed attempts are not retried, and what they say.

A failed attempt is normally retried (``max_restarts``). Some failures cannot go away by
running the same code again, and a retry only holds slots and delays the message:

- the entrypoint's program cannot be executed (exit 126: found but not executable; 127: not
  found, e.g. ``setpriv: failed to execute python: No such file or directory``): the
  environment lacks it, and every attempt starts in the same environment;
- an attempt that failed before its first metrics report with the same error signature as the
  previous attempt, which also failed before reporting: it failed the same way twice before
  training started (an import error, a missing file, a typo in an argument).

An import error (``ImportError``, ``ModuleNotFoundError``, or an ``AttributeError`` raised
while importing) names the missing module and points at the environments docs.

Everything here is pure: the control loop reads the rank's log tail and asks
:func:`judge_failure`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENVIRONMENTS_DOC = "docs/environments.md"
# exit codes of a shell, env, setpriv or exec wrapper that could not run the program
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
_EXEC_CODES = (EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND)

# "ValueError: ...", "torch.cuda.OutOfMemoryError: ...", "KeyError" alone on a line
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit))\b(:.*)?$")
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")
_CANNOT_IMPORT = re.compile(r"cannot import name '([^']+)' from '([^']+)'")
_MODULE_ATTRIBUTE = re.compile(r"module '([^']+)' has no attribute '([^']+)'")
# parts of a line that change from run to run without changing the failure
_VOLATILE = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"/tmp/[^\s'\":]+"), "/tmp/…"),
    (re.compile(r"\d+"), "#"),
)
_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


@dataclass(frozen=True, slots=True)
class FailureFacts:
    """What the control loop knows of one failed attempt of a trial."""

    exit_code: int | None  # of the first rank that failed
    log_tail: str  # the end of that rank's output (a few KB)
    reported: bool  # the attempt reported metrics before it failed


@dataclass(frozen=True, slots=True)
class FailureVerdict:
    """Whether to retry, and the words to add to the attempt's detail (may be empty)."""

    retry: bool
    note: str


def error_line(log_tail: str) -> str:
    """The last line of the tail that names an exception (a traceback's last line), else the
    last non-empty line; at most 300 characters."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line[:300]
    return lines[-1][:300] if lines else ""


def signature(facts: FailureFacts) -> str:
    """What two failures share when they are the same failure: the exit code and the error
    line, with addresses, temporary paths and numbers blanked out."""
    line = error_line(facts.log_tail)
    for pattern, replacement in _VOLATILE:
        line = pattern.sub(replacement, line)
    return f"exit {facts.exit_code}: {line}"


def import_problem(log_tail: str) -> str | None:
    """A sentence naming the module a script could not import, or None (not an import
    error). An ``AttributeError`` counts when the traceback shows it raised by an import."""
    line = error_line(log_tail)
    match = _EXCEPTION_LINE.match(line)
    if match is None:
        return None
    kind = match.group(1)
    if kind in _IMPORT_ERRORS:
        missing = _MISSING_MODULE.search(line)
        if missing:
            what = f"module '{missing.group(1)}' is not installed in the trial's environment"
        else:
            name = _CANNOT_IMPORT.search(line)
            what = (
                f"'{name.group(1)}' cannot be imported from module '{name.group(2)}' (another "
                "version of it is installed, or a circular import)"
                if name
                else "a module cannot be imported"
            )
    elif kind == "AttributeError" and _raised_at_import(log_tail):
        attribute = _MODULE_ATTRIBUTE.search(line)
        what = (
            f"module '{attribute.group(1)}' has no '{attribute.group(2)}' when imported "
            "(another version of it is installed)"
            if attribute
            else "an import failed with an AttributeError"
        )
    else:
        return None
    return (
        f"import error: {what}; add the package to the experiment's environment "
        f"(see {ENVIRONMENTS_DOC})"
    )


def _raised_at_import(log_tail: str) -> bool:
    """The traceback passes through an import statement (a frame whose code line imports)."""
    return any(
        line.strip().startswith(("import ", "from ")) or "<frozen importlib" in line
        for line in log_tail.splitlines()
    )


def judge_failure(current: FailureFacts, previous: FailureFacts | None) -> FailureVerdict:
    """Whether a failed attempt is retried, given the attempt before it (None: the first
    attempt, or the one before did not fail)."""
    notes: list[str] = []
    problem = import_problem(current.log_tail)
    if problem is not None:
        notes.append(problem)
    if current.exit_code in _EXEC_CODES:
        notes.append(
            "the entrypoint's program cannot be executed (exit code "
            f"{current.exit_code}: not found or not executable in the trial's environment); "
            "another attempt would fail the same way, so it is not restarted "
            f"(see {ENVIRONMENTS_DOC})"
        )
        return FailureVerdict(retry=False, note="; ".join(notes))
    if (
        previous is not None
        and not current.reported
        and not previous.reported
        and signature(current) == signature(previous)
    ):
        notes.append("failed the same way twice before training started; not restarted again")
        return FailureVerdict(retry=False, note="; ".join(notes))
    return FailureVerdict(retry=True, note="; ".join(notes))
