"""A user's fabfile: launcher's tasks, imported as they are (tests/e2e/test_fabric_tasks.py)."""

from launcher.tasks import deploy, doctor, history, logs, rollback, smoke, status, stop, verify

__all__ = ["deploy", "doctor", "history", "logs", "rollback", "smoke", "status", "stop", "verify"]
