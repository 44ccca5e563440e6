"""The seccomp filter of a sandboxed rank, compiled by libseccomp and handed to bwrap.

The filter allows every syscall but those :data:`trainhub.core.isolation.DENIED_SYSCALLS`
names (EPERM), ``clone`` with ``CLONE_NEWUSER`` (EPERM), ``ptrace`` attaching to a process
(EPERM: a rank traces only children that asked with ``PTRACE_TRACEME``) and ``clone3``
(ENOSYS: its flags are out of a filter's reach, and the C library falls back to ``clone``).
It is built with ``pyseccomp`` (ctypes bindings of the system's libseccomp2, API-compatible
with libseccomp's own Python module), once per process, and written to an anonymous file
whose descriptor bwrap reads with ``--seccomp FD``; bwrap installs it right before it
executes the rank, after it built the sandbox (its own mounts are not affected).

This module is imported inside Ray worker processes: standard library, pyseccomp lazily.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os

from trainhub.core.isolation import (
    FLAGS_HIDDEN,
    NO_NEW_USER_NAMESPACE,
    PTRACE_ATTACH,
    PTRACE_SEIZE,
    TRACE_OTHERS,
)

CLONE_NEWUSER = 0x10000000


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python bindings) is missing, or the filter could not be built."""


@functools.cache
def compiled_filter(denied: tuple[str, ...]) -> bytes:
    """The BPF program (raw ``struct sock_filter`` array, as bwrap reads it) for ``denied``."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # OSError: libseccomp.so.2 itself is missing
        raise SeccompUnavailable(
            f"no seccomp filter can be built: {exc} (pip install pyseccomp; "
            "apt-get install libseccomp2)"
        ) from exc
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        # a binary tree of syscall numbers, not a list: every allowed syscall (all of a
        # training step's) passes O(log n) comparisons (libseccomp >= 2.5)
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
        for name in denied:
            try:
                rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
            except (RuntimeError, ValueError, OSError):
                continue  # a syscall this architecture or libseccomp does not know
        rules.add_rule(
            seccomp.ERRNO(errno.EPERM),
            NO_NEW_USER_NAMESPACE,
            seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER),
        )
        for request in (PTRACE_ATTACH, PTRACE_SEIZE):  # a child's PTRACE_TRACEME is allowed
            rules.add_rule(
                seccomp.ERRNO(errno.EPERM), TRACE_OTHERS, seccomp.Arg(0, seccomp.EQ, request)
            )
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), FLAGS_HIDDEN)
        with os.fdopen(os.memfd_create("trainhub-seccomp-build", 0), "w+b") as sink:
            rules.export_bpf(sink)
            sink.seek(0)
            return sink.read()
    except (RuntimeError, ValueError, OSError) as exc:
        raise SeccompUnavailable(f"cannot build the seccomp filter: {exc}") from exc


def filter_fd(denied: tuple[str, ...]) -> int:
    """A fresh readable descriptor of the filter (bwrap reads it to the end; close it after)."""
    program = compiled_filter(denied)
    fd = os.memfd_create("trainhub-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
