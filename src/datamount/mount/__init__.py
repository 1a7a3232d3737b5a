"""Mounts on this node: control (outside the daemon), the daemon, the stack it serves."""
