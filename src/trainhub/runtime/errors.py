"""Errors the runtime raises to the training script."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from trainhub.runtime import protocol


class SpecRefused(ValueError):
    """The spec and the script disagree in a way another attempt cannot fix (a ``model`` or
    ``distill`` line naming a layer the model lacks, shapes that do not match).

    Left uncaught, it ends the process with ``protocol.EXIT_SPEC_REFUSED`` after the runtime
    delivered its metrics, and the control plane fails the trial at once instead of restarting
    it ``max_restarts`` times; the message is the trial's failure reason.
    """


class QuotaExceeded(RuntimeError):
    """The trial wrote more than its storage quota allows (its checkpoints and what it wrote
    into its checkpoint folder, home and scratch); the message has the numbers.

    ``ctx.report`` and ``ctx.save_checkpoint`` raise it once the control plane refused a
    report or an upload for this reason; the control plane stops the trial meanwhile and
    keeps its folder read-only.
    """


@contextlib.contextmanager
def refusing_the_spec() -> Iterator[None]:
    """Raise the ``ValueError`` of a step the spec drives (``ctx.init_model``,
    ``ctx.distiller``) as :class:`SpecRefused`, same message; one marked ``transient`` (the
    control plane was unreachable) stays as it is."""
    try:
        yield
    except SpecRefused:
        raise
    except ValueError as exc:
        if getattr(exc, "transient", False):
            raise
        raise SpecRefused(str(exc)) from None


def exit_on_refused_spec(exc_type: type[BaseException], close: Callable[[], object]) -> None:
    """Called by the runtime's exception hook after the traceback is printed: for an uncaught
    :class:`SpecRefused`, deliver what is pending (``close``) and end the process with
    ``protocol.EXIT_SPEC_REFUSED`` (``os._exit``: the interpreter would exit with 1)."""
    if not issubclass(exc_type, SpecRefused):
        return
    try:
        close()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(protocol.EXIT_SPEC_REFUSED)
