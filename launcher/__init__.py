"""launcher: deploy and verify long training runs inside Proxmox LXC containers over SSH."""

__version__ = "0.1.0"
