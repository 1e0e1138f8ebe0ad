"""A user's fabfile: launcher's tasks, imported as they are (tests/e2e/test_fabric_tasks.py)."""

from launcher.tasks import deploy, logs, status, stop, verify

__all__ = ["deploy", "logs", "status", "stop", "verify"]
