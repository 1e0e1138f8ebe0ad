"""The error tree and the one table that maps errors to exit codes."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes, the same for every command (documented in the README)."""

    OK = 0
    UNHEALTHY = 1  # a check failed, the trainer crashed or stalled
    USAGE = 2  # bad flag, invalid inventory or playbook, unsafe path
    UNREACHABLE = 3  # SSH, auth, host key, container missing or stopped
    REFUSED = 4  # lock held by another deploy, active run without --restart
    # deploy --verify --rollback-on-failure, smoke --rollback-on-failure: the new run failed
    # its startup probe, and then:
    ROLLED_BACK = 5  # the previous run was put back and is healthy again
    ROLLED_BACK_UNHEALTHY = 6  # the previous run was put back but is not healthy either
    ROLLBACK_FAILED = 7  # putting the previous run back failed: nothing healthy runs
    INTERRUPTED = 130
    PIPE_CLOSED = 141  # stdout's reader went away, as for a process killed by SIGPIPE


class LauncherError(Exception):
    """An expected failure: printed as one message (plus an optional hint), never a traceback."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(LauncherError):
    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A problem in inventory.yaml or a playbook; `problems` holds one line per problem."""

    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        super().__init__("\n".join(problems), hint=hint)
        self.problems = problems


class UnsafePathError(UsageError):
    """A path that would make a destructive step leave the workdir; nothing was touched."""


class RemoteError(LauncherError):
    """The target cannot be reached or acted on."""

    exit_code = ExitCode.UNREACHABLE


class ConnectError(RemoteError):
    """TCP connect, SSH banner or key exchange failed (retried with backoff)."""


class HostKeyError(RemoteError):
    """The host key is unknown or changed (never retried, never auto-accepted)."""


class AuthError(RemoteError):
    """Authentication was refused (never retried)."""


class CommandTimeout(RemoteError):
    """A remote command did not finish before its deadline."""


class ContainerError(RemoteError):
    """The container is missing, stopped, or lacks what the run needs."""


class PausedError(RemoteError):
    """The container did not answer because it is frozen or locked (a backup, a snapshot): the
    run is paused, not down (launcher.container.ctstate)."""


class TransferError(RemoteError):
    """An upload did not arrive intact."""


class ProtocolError(RemoteError):
    """The agent's answer is not what this launcher's protocol says (keys, types): the container
    ran something other than the agent it was sent."""


class RefusedError(LauncherError):
    """launcher declined to act, to protect a running job or another operator."""

    exit_code = ExitCode.REFUSED


class UnhealthyError(LauncherError):
    """The run was judged unhealthy."""

    exit_code = ExitCode.UNHEALTHY
