"""What the doctor's checks look at: the configuration, roots, engine and spec dirs, with
the expensive facts (NVML, discovery) computed once and shared."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nvshim.config import Config
from nvshim.doctor import Skip
from nvshim.errors import NvshimError

NEEDS_DRIVER = "needs a working driver (see check driver)"
DEFAULT_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")


class Context:
    """Inputs of one doctor run. ``engine_options`` are ``nvshim configure``'s options
    (``None``: not given; environment and defaults apply as for configure)."""

    def __init__(
        self,
        config: Config,
        driver_root: str,
        dev_root: str,
        engine: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
        cdi_dirs: Sequence[str] = (),
        hooks_dirs: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        from nvshim.cdi.registry import DEFAULT_SPEC_DIRS

        self.config = config
        self.driver_root = os.path.abspath(driver_root)
        self.dev_root = os.path.abspath(dev_root)
        self.engine_name = engine
        self.engine_options = dict(engine_options or {})
        self.cdi_dirs = tuple(cdi_dirs) or DEFAULT_SPEC_DIRS
        self.hooks_dirs = tuple(hooks_dirs) or DEFAULT_HOOKS_DIRS
        self.env = os.environ if env is None else env
        self._memo: dict[str, tuple[bool, Any]] = {}
        self.ld_warnings: list[str] = []  # the driver root's ld.so.cache, read by snapshot()

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once; a raised exception is remembered and raised again."""
        if key not in self._memo:
            try:
                self._memo[key] = (True, compute())
            except Exception as err:  # noqa: BLE001 - re-raised to every caller
                self._memo[key] = (False, err)
        good, value = self._memo[key]
        if not good:
            raise value
        return value

    def path(self, path: str) -> str:
        """Host path of ``/dev``, ``/proc`` or ``/sys`` path ``path`` under the dev root."""
        from nvshim.host.rootpath import host_path

        return host_path(self.dev_root, path)

    def snapshot(self):
        """NVML's view (driver, GPUs, MIG devices); NvshimError when NVML is unusable."""

        def query():
            from nvshim.host import files, nvml

            entries = files.read_ld_cache(self.driver_root, self.ld_warnings)
            library = nvml.find_library(self.driver_root, entries)
            if library is None and self.driver_root != "/":
                raise NvshimError(
                    f"driver root {self.driver_root}: no NVML library (libnvidia-ml.so.1)"
                )
            return nvml.query(library)

        return self.once("snapshot", query)

    def host(self):
        """The discovered host; Skip when the driver is unusable."""
        try:
            self.snapshot()
        except NvshimError:
            raise Skip(NEEDS_DRIVER) from None

        def discover():
            from nvshim.host.discover import discover_host

            return discover_host(self.driver_root, self.dev_root)

        return self.once("host", discover)

    def nvml_session(self):
        """An initialised pynvml bound to the host's NVML (a context manager)."""
        from nvshim.mps.compute import nvml_session

        return nvml_session(self.host())

    def engine(self):
        """The engine's resolved settings (as ``nvshim configure`` would use them);
        Skip when no engine is named and none is found on this node."""

        def resolve():
            from nvshim.engines import ENGINES
            from nvshim.engines.settings import resolve_settings

            name = self.engine_name or self.env.get("NVSHIM_ENGINE")
            if name:
                return resolve_settings(name, self.engine_options, self.env)
            for candidate in ENGINES:
                settings = resolve_settings(candidate, self.engine_options, self.env)
                if os.path.exists(settings.socket) or os.path.exists(settings.config):
                    return settings
            raise Skip("no container engine found (name one with --engine)")

        return self.once("engine", resolve)


def files_in(dirs: Sequence[str], suffixes: tuple[str, ...]) -> list[str]:
    """Regular files ending in ``suffixes`` in each of ``dirs`` (missing dirs: none), in
    directory order then name order."""
    paths = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        paths += [
            os.path.join(directory, n)
            for n in names
            if n.endswith(suffixes) and os.path.isfile(os.path.join(directory, n))
        ]
    return paths
