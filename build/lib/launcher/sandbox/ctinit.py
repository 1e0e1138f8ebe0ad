#!/usr/bin/python3
# mypy: allow-untyped-calls
"""PID 1 for sandbox containers: bring loopback up, reap orphaned children, exit on SIGTERM,
SIGPWR or SIGINT.

When PID 1 of a PID namespace exits, the kernel kills everything else in it, so leaving
is all a stop needs (lxc-stop sends SIGPWR, then SIGKILL after its timeout).

Runs on the container's own python3 (3.9 on bullseye): stdlib only, no newer syntax.
"""

import fcntl
import os
import signal
import socket
import struct
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


# <linux/sockios.h>, <net/if.h>: struct ifreq is the name (16 bytes) and a union (24 bytes)
# whose first member, for these two requests, is the short ifr_flags.
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sH22x"


def loopback_up():
    """What a Proxmox CT's own init does from the `auto lo` / `iface lo inet loopback` stanza
    Proxmox writes to /etc/network/interfaces (PVE::LXC::Setup::Debian): LXC leaves `lo` of a
    new network namespace down, and a trainer that opens a local port (torchrun's c10d
    rendezvous on 127.0.0.1) fails without it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(IFREQ, b"lo", 0)
        flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def main():
    try:
        loopback_up()
    except OSError as exc:  # a container without CAP_NET_ADMIN still runs; say why lo is down
        sys.stderr.write("ctinit: could not bring lo up: %s\n" % exc)
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
