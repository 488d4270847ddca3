"""The ``nvshim`` command's entry point. ``nvshim cdi generate`` with the options of
``nvshim.cli.cdi.generate`` runs here without click (importing it costs ~20 ms, as much
as the whole command's work on an 8-GPU host); every other command line, and any
``generate`` line this reader does not take as it is (``--help``, an unknown option, a
bad choice, a missing value), goes to the click CLI, which also prints its errors.
``GENERATE_OPTIONS`` mirrors the click options; a test holds the two to each other.
"""

from __future__ import annotations

import sys

# option -> (keyword, choices or None for free text, multiple); flags are in GENERATE_FLAGS
GENERATE_OPTIONS: dict[str, tuple[str, tuple[str, ...] | None, bool]] = {
    "-o": ("output", None, False),
    "--output": ("output", None, False),
    "--format": ("fmt", ("yaml", "json"), False),
    "--device-name-strategy": ("strategies", ("index", "uuid", "type-index"), True),
    "--mode": ("mode", ("nvml", "management"), False),
    "--vendor": ("vendor", None, False),
    "--class": ("cls", None, False),
    "--capabilities": ("capabilities", None, False),
    "--hook-path": ("hook_path", None, False),
    "--driver-root": ("driver_root", None, False),
    "--dev-root": ("dev_root", None, False),
}
GENERATE_FLAGS = {
    "--no-all-device": "no_all_device",
    "--sharing": "sharing",
    "--pairing": "pairing",
}
GENERATE_DEFAULTS: dict[str, object] = {
    "output": None,
    "fmt": None,
    "strategies": (),
    "mode": "nvml",
    "vendor": None,
    "cls": None,
    "capabilities": None,
    "hook_path": None,
    "driver_root": None,
    "dev_root": None,
    "no_all_device": False,
    "sharing": False,
    "pairing": False,
}


def generate_arguments(args: list[str]) -> dict[str, object] | None:
    """The keyword arguments of ``cdi generate ARGS`` as click would pass them, or None
    when the line is not one this reader takes (click then handles it)."""
    if args[:2] != ["cdi", "generate"]:
        return None
    values = dict(GENERATE_DEFAULTS)
    rest = args[2:]
    at = 0
    while at < len(rest):
        arg = rest[at]
        at += 1
        if arg in GENERATE_FLAGS:
            values[GENERATE_FLAGS[arg]] = True
            continue
        option, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if not eq and option not in GENERATE_OPTIONS and arg[:2] == "-o" and len(arg) > 2:
            option, eq, value = "-o", "=", arg[2:]
        if option not in GENERATE_OPTIONS:
            return None
        if not eq:
            if at >= len(rest):
                return None
            value = rest[at]
            at += 1
        key, choices, multiple = GENERATE_OPTIONS[option]
        if choices is not None and value not in choices:
            return None
        if multiple:
            values[key] = (*values[key], value)
        else:
            values[key] = value
    return values


def run_generate(values: dict[str, object]) -> None:
    """``nvshim cdi generate`` with ``values``: the config's roots as defaults, as the
    click command's ``root_options`` apply them."""
    from nvshim.cdi.generate import generate
    from nvshim.console import load_config_warn, roots

    config = load_config_warn()
    options = dict(values)
    driver_root, dev_root = roots(config, options.pop("driver_root"), options.pop("dev_root"))
    output = options.pop("output")
    generate(output, driver_root, dev_root, config, **options)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    args = sys.argv[1:] if argv is None else list(argv)
    values = generate_arguments(args)
    if values is None:
        from nvshim.cli import main as cli_main

        cli_main(argv)
        return
    from nvshim.console import guarded

    guarded(run_generate, values, help_command="nvshim cdi generate")
