"""Isolated launchers for ``nvshim-runtime`` and ``nvshim-hook`` (hook entries for specs:
``nvshim.hookentries``).

Runtimes execute these as root on container input, so they start Python as
``<real interpreter> -IS`` (isolated, no site): no PYTHON* variable, user site or
``.pth`` file can reach the interpreter. The launcher puts the exact directories nvshim
and its dependencies live in on ``sys.path`` itself.
"""

from __future__ import annotations

import os
import sys

LAUNCHERS = {
    "nvshim-runtime": "nvshim.runtime.client",
    "nvshim-hook": "nvshim.hook.main",
    "nvshim-runtimed": "nvshim.runtimed.main",
}
# The ``nvshim`` command itself, for installs that bring their own interpreter.
CLI_LAUNCHER = {"nvshim": "nvshim.entry"}


def real_interpreter() -> str:
    """The interpreter binary behind ``sys.executable`` (never a venv link or a shim)."""
    return os.path.realpath(sys.executable)


def import_roots() -> list[str]:
    """Directories that must be on ``sys.path`` for nvshim and its dependencies."""
    import importlib.util

    roots: list[str] = []
    for name in ("nvshim", "pynvml", "yaml", "tomlkit", "click", "pyroute2"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        origin = spec.origin
        # package/__init__.py -> parent of package; module.py -> its directory
        parent = os.path.dirname(origin)
        if os.path.basename(origin) == "__init__.py":
            parent = os.path.dirname(parent)
        if parent not in roots:
            roots.append(parent)
    return roots


def python_code(
    module: str,
    roots: list[str] | None = None,
    argv0: bool = False,
    cache_dir: str | None = None,
    entry: str = "main",
    under_prefix: bool = False,
) -> str:
    """Python source that runs ``module.entry()`` with ``roots`` on ``sys.path`` and exits
    with its status. ``argv0``: run as ``-c CODE PROGRAM ARGS`` (the sh front), where
    ``PROGRAM`` becomes ``sys.argv[0]``. ``cache_dir``: the cache directory when
    ``NVSHIM_CACHE_DIR`` is not set (before anything reads the environment).
    ``under_prefix``: ``roots`` are relative to the interpreter's ``sys.prefix`` (a host
    bundle that runs from wherever it was unpacked)."""
    path = import_roots() if roots is None else list(roots)
    extend = (
        f"sys.path.extend([sys.prefix + '/' + root for root in {path!r}])\n"
        if under_prefix
        else f"sys.path.extend({path!r})\n"
    )
    default = (
        f"import posix\nposix.environ.setdefault(b'NVSHIM_CACHE_DIR', {os.fsencode(cache_dir)!r})\n"
        if cache_dir
        else ""
    )
    return (
        "import sys\n"
        + default
        + ("sys.argv[0:2] = sys.argv[1:2]\n" if argv0 else "")
        + "# after the standard library: nothing here can shadow one of its modules\n"
        + extend
        + f"from {module} import {entry}\n"
        f"code = {entry}() or 0\n"
        "for stream in (sys.stdout, sys.stderr):\n"
        "    try:\n"
        "        stream.flush()\n"
        "    except (AttributeError, OSError, ValueError):\n"
        "        code = code or 1\n"
        "# every file is closed by now: skip interpreter teardown (about 1 ms per container)\n"
        "import os\n"
        "os._exit(code)\n"
    )


def _front_parts(interpreter: str | None, roots: list[str] | None, cache_dir: str | None):
    """The ``nvshim-runtime`` front's interpreter, Python code, cache directory, slots
    name and lost-call code (for the sh front and the compiled one alike)."""
    from nvshim import __version__
    from nvshim.runtime.slots import slots_name

    python = interpreter or real_interpreter()
    roots = import_roots() if roots is None else roots
    code = python_code(LAUNCHERS["nvshim-runtime"], roots, argv0=True, cache_dir=cache_dir)
    lost = python_code(LAUNCHERS["nvshim-runtime"], roots, argv0=True, cache_dir=cache_dir,
                       entry="abandoned")  # fmt: skip
    # the daemon this front's Python would be: nvshim from the first root
    name = slots_name(__version__, os.path.join(roots[0], "nvshim", "__init__.py"))
    return python, code, cache_dir, name, lost


def launcher_text(
    module: str,
    interpreter: str | None = None,
    roots: list[str] | None = None,
    cache_dir: str | None = None,
) -> str:
    """Source of an isolated launcher that runs ``module.main()``.

    ``interpreter`` and ``roots`` default to the running interpreter and its import roots;
    a host bundle passes the final paths it will live at (never a staging directory).
    ``nvshim-runtime`` is the sh front (``nvshim.runtime.front``) around the same code.
    ``cache_dir``: a default for ``NVSHIM_CACHE_DIR`` (tests keep caches off the host).
    """
    if module == LAUNCHERS["nvshim-runtime"]:
        from nvshim.runtime.front import front_text

        return front_text(*_front_parts(interpreter, roots, cache_dir))
    python = interpreter or real_interpreter()
    return (
        f"#!{python} -IS\n"
        "# Generated by `nvshim install`: isolated (-I -S) so no environment reaches Python.\n"
        + python_code(module, roots, cache_dir=cache_dir)
    )


def launcher_bytes(
    module: str,
    interpreter: str | None = None,
    roots: list[str] | None = None,
    cache_dir: str | None = None,
    compiled: bool | None = None,
) -> bytes:
    """The launcher file for ``module``: :func:`launcher_text`, except ``nvshim-runtime``
    where this nvshim has a compiled front for this machine
    (``nvshim.runtime.frontbin``) and ``compiled`` is not False (True: required)."""
    if module == LAUNCHERS["nvshim-runtime"] and compiled is not False:
        from nvshim.runtime.front import front_fields
        from nvshim.runtime.frontbin import compiled_front

        binary = compiled_front(front_fields(*_front_parts(interpreter, roots, cache_dir)))
        if binary is not None:
            return binary
        if compiled:
            from nvshim.errors import NvshimError

            raise NvshimError("no compiled nvshim-runtime front for this machine "
                              "(python3 -m nvshim.runtime.frontbin build)")  # fmt: skip
    return launcher_text(module, interpreter, roots, cache_dir).encode()


def write_launchers(
    bin_dir: str,
    interpreter: str | None = None,
    roots: list[str] | None = None,
    cli: bool = False,
    cache_dir: str | None = None,
    compiled: bool | None = None,
) -> list[str]:
    """Write the launchers into ``bin_dir`` (mode 0755, atomically); return their paths.

    ``interpreter``/``roots``: see :func:`launcher_text`. ``cli`` adds an isolated
    ``nvshim`` command launcher too (a host bundle has no console-script wrapper).
    ``cache_dir``, ``compiled``: see :func:`launcher_bytes`.
    """
    from nvshim.fsutil import atomic_write

    os.makedirs(bin_dir, exist_ok=True)
    written = []
    launchers = {**LAUNCHERS, **(CLI_LAUNCHER if cli else {})}
    for name, module in launchers.items():
        path = os.path.join(bin_dir, name)
        data = launcher_bytes(module, interpreter, roots, cache_dir, compiled)
        atomic_write(path, data, mode=0o755)
        written.append(path)
    return written
