"""Sharing configs for tests, in the device plugin's format."""

from __future__ import annotations


def mixed_sharing(mode: str, replicas: dict[str, int]) -> str:
    """A config under ``migStrategy: mixed`` sharing in ``mode`` ("mps"/"timeSlicing") each
    resource of ``replicas`` (``{"nvidia.com/gpu": 4}``) that many ways."""
    head = f"version: v1\nflags: {{migStrategy: mixed}}\nsharing:\n  {mode}:\n    resources:\n"
    return head + "".join(f"    - {{name: {r}, replicas: {n}}}\n" for r, n in replicas.items())
