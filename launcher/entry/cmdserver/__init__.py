"""The command server: a background process that has launcher's CLI imported and forks one
child per command, so that a command skips Python's start and the imports (click, pydantic,
the configuration models, verify), as Mercurial's chg does for hg.

- wire.py: the messages between a client and the server, where the server listens and the
  fingerprint of the code it serves (standard library only).
- client.py: what the console script runs before it imports click (standard library only):
  the command handed to a server with the terminal's file descriptors, or None.
- server.py: the background process (`python -c ... launcher.entry.cmdserver.server`).

docs/internals.md ("The command server") says why this is safe and when it is used.
"""
