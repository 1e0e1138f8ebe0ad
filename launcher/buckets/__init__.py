"""Length buckets for a bucketed shuffle: `launcher buckets plan`.

- `lengths`: load sample lengths (one integer a line, `.npy`, JSON lines) and check them;
- `optimize`: the exact boundary optimisation and its cost model;
- `simulate`: the batching simulation that measures padding efficiency;
- `playbook`: records a plan in a playbook (`buckets:` and `verify.queues.q_pre`).

numpy (the optional extra `proxmox-launcher[buckets]`) is needed by every module but this one; call
`require_numpy()` before importing them, so that a missing numpy is a clear usage error.
"""

from __future__ import annotations

from launcher.core.errors import UsageError

INSTALL_HINT = "pip install 'proxmox-launcher[buckets]'   (or: pip install 'numpy>=1.24')"


def require_numpy() -> None:
    """Raise a UsageError naming the pip command when numpy cannot be imported."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise UsageError(
            "`launcher buckets` needs numpy, which is not installed", hint=INSTALL_HINT
        ) from None
