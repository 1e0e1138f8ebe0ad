"""launcher's version: a leaf module, so that what reports it (deploy records, `--version`, the
watch notifier's User-Agent) need not import the package's API (launcher/__init__.py)."""

__version__ = "0.1.0"
