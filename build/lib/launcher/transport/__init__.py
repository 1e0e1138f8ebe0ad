"""How commands reach a Proxmox host: where to connect (resolve.py, sshconfig.py), the SSH
connection within one deadline (ssh.py, sshopen.py, sshkeys.py, sshlibs.py), the runners that
carry commands (runner.py: direct SSH, relay.py, persist.py; frames.py their one frame format),
the one place that chooses among them (connection.py), one connection per host (pool.py).

Empty on purpose: importing the package imports none of its modules.
"""
