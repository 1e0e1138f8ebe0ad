"""Local staging host for launcher: sshd on 127.0.0.1, LXC containers, a pct stand-in."""

from launcher.sandbox.manager import Sandbox, SandboxInfo, SandboxStatus

__all__ = ["Sandbox", "SandboxInfo", "SandboxStatus"]
