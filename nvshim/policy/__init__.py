"""Request-side policy: what a container asks for and whether it may have it.

Pure functions over the OCI spec and the host model, shared by ``nvshim-runtime`` and
``nvshim-hook``. Modules here import only the standard library and nvshim, and nothing
is imported at package level, so each caller pays only for what it uses:

- ``request``: the container's request (CDI annotations, ``/dev/null`` mounts, env).
- ``capabilities``: ``NVIDIA_DRIVER_CAPABILITIES``.
- ``cuda_table`` and ``require``: ``NVIDIA_REQUIRE_*`` against the driver.
- ``resolve``: device ids to the host's GPUs and MIG devices.
- ``visible``: the ``CUDA_VISIBLE_DEVICES`` a container gets.
"""
