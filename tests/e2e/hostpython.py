"""Whether a Python on this host has the packages the PyTorch and Hugging Face tests run in the
containers (which share the host's /usr): looked up, not imported. Importing torch costs about
1.5 s of CPU, transformers 2.4 s, and a module-level check runs in every worker of every tier."""

from __future__ import annotations

import functools
import subprocess

SYSTEM_PYTHON = "/usr/bin/python3"
HF_VENV = "/usr/local/lib/launcher-e2e-hf"  # ./run setup makes it (setup_hf)

# Top-level names only: find_spec of a submodule imports its parent packages.
FOUND = "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))"


@functools.cache
def has_packages(python: str, *packages: str) -> bool:
    probe = [python, "-c", FOUND, *packages]
    return subprocess.run(probe, capture_output=True, check=False, timeout=60).returncode == 0


def host_has_torch() -> bool:
    """Debian's python3-torch (./run setup installs it)."""
    return has_packages(SYSTEM_PYTHON, "torch")


def host_has_hf_trainer() -> bool:
    """transformers and accelerate in HF_VENV, over the host's torch."""
    return has_packages(f"{HF_VENV}/bin/python", "transformers", "accelerate", "torch")
