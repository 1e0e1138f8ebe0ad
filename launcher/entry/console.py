"""The `launcher` console script and `python -m launcher`.

The CLI runs here, then the process ends at once with its exit code, after flushing its output
and shutting logging down: by then the command has closed its connections and joined every
thread it started, and what would follow is the interpreter's teardown (freeing every module:
paramiko, pydantic, ... ~0.05 s), which nothing needs. os._exit is called here only.

Standard library only until the CLI is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NoReturn, TextIO

from launcher.core import collector

VERSION = (["--version"], ["-V"])


def main() -> NoReturn:
    sys.unraisablehook = interrupt_or_report
    try:
        open_standard_streams()
        _main()
    except KeyboardInterrupt:
        interrupted()


def open_standard_streams() -> None:
    """A descriptor of 0, 1 and 2 that the shell closed (`launcher status >&-`, `2>&-`) is
    pointed at /dev/null, as OpenSSH does before anything else (misc.c, sanitise_stdfd): what
    would go there is dropped, the command runs and exits with its own code, and no file or
    socket launcher opens later takes that number and receives what was meant for the stream.
    Python starts with sys.stdout (stdin, stderr) None for such a descriptor: a stream again."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            if getattr(sys, name) is not None:
                continue
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        errors = "backslashreplace" if fd == 2 else None
        stream = open(fd, mode, closefd=False, errors=errors)  # noqa: SIM115 (the process's own)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.stderr = TolerantStream(sys.stderr)


class TolerantStream:
    """stderr (progress, warnings, errors) whose reader may be gone (`2>&1 | head -1`, a closed
    pipe): a write that fails is dropped, and so is everything after it, so that a lost
    progress line never ends a command that was running (a deploy half-way) nor changes its
    exit code. stdout keeps failing loudly: a reader that leaves ends the command (exit 141)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):
                self._broken = True
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._broken = True

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer ...
        return getattr(self._stream, name)


def interrupted() -> NoReturn:
    """Ctrl-C before the CLI's own handler is in place (while the libraries load): exit 130
    like a later Ctrl-C, not with the interpreter's KeyboardInterrupt traceback."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    os._exit(130)  # ExitCode.INTERRUPTED (errors.py is not imported yet)


def interrupt_or_report(unraisable: sys.UnraisableHookArgs) -> None:
    """sys.unraisablehook while the libraries load. A Ctrl-C that lands in a callback the
    interpreter cannot raise from (the weakref callback of an import's module lock, a __del__)
    is printed as "Exception ignored ... KeyboardInterrupt" and then lost; it ends the process
    here as any other Ctrl-C at start-up does. Anything else gets the interpreter's report."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        interrupted()
    sys.__unraisablehook__(unraisable)


def _main() -> NoReturn:
    argv = sys.argv[1:]
    if _asks_version_only(argv):
        _version()
    _persist_when_interactive()
    collector.defer()  # until the command's first remote command
    os._exit(run_cli())


def run_cli() -> int:
    """The CLI in this process, its output flushed and logging shut down: its exit code."""
    from launcher.cli.main import flush_stdout
    from launcher.cli.main import main as cli_main

    sys.unraisablehook = sys.__unraisablehook__  # from here a Ctrl-C is the command's to handle
    try:
        cli_main()
        code: object = 0
    except SystemExit as done:
        code = done.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what sys.exit("message") does
        code = 1
    try:
        flush_stdout()  # a reader that went away: exits 141 here, the usual way
    except SystemExit as done:
        code = done.code
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    if "logging" in sys.modules:  # handlers `--debug` added: flushed, closed, as at exit
        sys.modules["logging"].shutdown()
    return code if isinstance(code, int) else 0


def _persist_when_interactive() -> None:
    """On an interactive terminal, a host whose inventory sets no control_persist keeps its
    connection 60 s for the next command (persistidle.default_idle), as Ansible's ssh connection
    does with ControlPersist; not under CI=true, nor for scripts (no terminal): each of their
    runs stands alone and leaves no process behind. The user's own setting wins."""
    if os.environ.get("CI", "").lower() == "true":
        return
    try:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return
    if interactive:
        from launcher.transport.persistidle import DEFAULT_ENV, INTERACTIVE_IDLE

        os.environ.setdefault(DEFAULT_ENV, f"{INTERACTIVE_IDLE:g}")


def _asks_version_only(argv: list[str]) -> bool:
    """`--version` (or `-V`) and nothing but the global options: what click would answer with
    the version line alone (its version option is eager) before anything else is read."""
    from launcher.entry import globalargs

    return globalargs.read(argv).rest in VERSION


def _version() -> NoReturn:
    """`launcher --version` alone: the line click's version option prints (cli/main.py), with
    nothing but the standard library imported (click alone takes longer than Python's start)."""
    from launcher.core.version import __version__

    try:
        sys.stdout.write(f"launcher, version {__version__}\n")
        sys.stdout.flush()
    except BrokenPipeError:
        from launcher.core.errors import ExitCode

        os._exit(int(ExitCode.PIPE_CLOSED))  # the reader went away, as in cli/main.py
    os._exit(0)
