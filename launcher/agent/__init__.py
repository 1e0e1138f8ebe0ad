"""The in-container agent: one request in, one JSON answer out, in a single round trip.

launcher runs it inside the container with

    pct exec VMID -- python3 -I -S -c BOOT

where BOOT (`launcher.agent.protocol.BOOT`) reads one JSON line from stdin and runs the loader it
carries (`boot.py`). It therefore runs on whatever python3 the container has: every module here
is Python 3.8 syntax and standard library only, and imports nothing from launcher but
`launcher.agent.protocol` (which travels with it) and its own modules.

The package, one job a module (each imports only the ones before it in MODULES):

    base       AgentError, running commands, time, hashes, small file helpers
    processes  the container's processes from /proc: a run's tree, signals, waits
    nvsmi      nvidia-smi run detached, bounded, one at a time; its failures named
    gpus       GPUs: nvidia-smi for device facts, /proc/<pid>/fd for who holds a device
    lock       the deploy lock
    params     a request's values, checked
    paths      paths in the workdir, the checks on them, the run's records
    runs       each run's spec (to put it back) and where its checkpoints are now
    tmux       tmux and a session's state
    preflight  the `preflight` op
    archives   checkpoint archives: made, measured, pruned only with the user's word
    commandcheck  the run's command: its program and script exist, before the stop
    stop       stopping a run for real, the `stop` op
    resources  the deploy's checks of disk room and GPUs for the new run
    deploy     the deploy transaction: step functions over `DeployState`, the `apply` op
    rollback   the `rollback` op: the run put back through the deploy transaction
    release    project releases: the `releases` op, a release plugged into the transaction
    poll       the `poll` op
    logs       the `logs`, `follow` and `history` ops
    network    the `network` op: names, interfaces, torch, the master port's reach (jobs)
    cache      the bundle cache in the container (/run/launcher, by sha256)
    main       the op table (HANDLERS), the envelope, `main(request)`
    boot       the loader BOOT runs: not part of the bundle, it travels on every call

How it travels (`launcher.container.agentclient.bundle`): "the bundle" is the sources of
`launcher.agent.protocol` and of MODULES, in that order, as one text: name, NUL, source, NUL,
name, ...
(Python source never holds a NUL). One text means one sha256 (the cache key and the pin of both
sides of the protocol to one version), one file in the container's cache, one compiled copy.
The loader compiles each source on its own and runs it as a real module registered in
`sys.modules` under its real name, in that order, so `from launcher.agent.base import run` inside
the container finds the module the loader made a moment before, and no import system, file or
`sys.path` entry is involved. The modules therefore see the same namespaces in the container as
on the client, where tests import them as the ordinary package they are.
"""

from __future__ import annotations

# The bundle's modules in dependency order: a module imports only modules before it
# (tests/local/test_agent_package.py checks it, and that every module of the package but boot is
# here). launcher.agent.protocol comes first of all.
MODULES = (
    "base",
    "processes",
    "nvsmi",
    "gpus",
    "lock",
    "params",
    "paths",
    "runs",
    "tmux",
    "preflight",
    "archives",
    "commandcheck",
    "stop",
    "resources",
    "deploy",
    "rollback",
    "release",
    "poll",
    "logs",
    "network",
    "cache",
    "main",
)
