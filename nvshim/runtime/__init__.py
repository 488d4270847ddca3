"""``nvshim-runtime``: an OCI runtime that wraps runc and injects GPUs at create."""
