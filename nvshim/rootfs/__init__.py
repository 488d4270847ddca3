"""The in-container file-system toolkit: a container's root opened by fd (``fsroot``),
raw syscalls (``kernel``), mount tables, namespaces, private binds and a read-only root
made writable for a step. nvshim-hook's steps and nvshim-runtime's finishing steps both
use it; it imports nothing of either."""
