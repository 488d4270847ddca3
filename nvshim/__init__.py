"""nvshim: host-level GPU runtime shim for Linux containers."""

__version__ = "0.1.0"
