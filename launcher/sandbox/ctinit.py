#!/usr/bin/python3
# mypy: allow-untyped-calls
"""PID 1 for sandbox containers: reap orphaned children, exit on SIGTERM, SIGPWR or SIGINT.

When PID 1 of a PID namespace exits, the kernel kills everything else in it, so leaving
is all a stop needs (lxc-stop sends SIGPWR, then SIGKILL after its timeout).
"""

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGPWR, signal.SIGINT)
WAITED = (signal.SIGCHLD, *STOP_SIGNALS)


def _noop(signum, frame):
    pass


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    # PID 1 only receives signals it handles, so install handlers, then block and wait.
    for signum in WAITED:
        signal.signal(signum, _noop)
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    while True:
        reap()
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo in STOP_SIGNALS:
            reap()
            return 0


if __name__ == "__main__":
    sys.exit(main())
