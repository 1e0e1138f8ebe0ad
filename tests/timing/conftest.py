"""The timing tier's fixtures: the end-to-end ones (tests/e2e/conftest.py), for the timing tests
that need the sandbox (tests/conftest.py marks those `e2e` too), and its isolation (HOME and
the runtime directory of a test's own) for every timing test."""

from tests.e2e.conftest import (  # noqa: F401 (fixtures: pytest finds them here)
    _keep_developer_ssh_out,
    _private_runtime_dir,
    project,
    sandbox,
)
