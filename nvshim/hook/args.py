"""``nvshim-hook``'s command line, parsed by hand: ``argparse`` pulls in ``re``,
``gettext`` and ``shutil`` (about 5 ms), and the hook starts once per GPU container.

Grammar: ``nvshim-hook [--config FILE] STEP [OPTIONS]``; options take ``--name VALUE``
or ``--name=VALUE``; ``--config`` may also follow the step. ``finish`` takes the rest of
the line as ``STEP ARGS [+ STEP ARGS]...``. Errors raise UsageError (exit status 2) worded
as click words the ``nvshim`` command's (docs/commands.md "Conventions").

NVIDIA's CDI hook lines are taken as they are (docs/coming-from-nvidia-toolkit.md): the
``nvidia-ctk hook NAME ...`` form (a leading ``hook`` word), its global ``-d/--debug`` and
``--quiet`` (accepted, ignored: nvshim logs every decision), its hooks and their flags
(``--ldconfig-path`` is ``--ldconfig``; ``--container-spec FILE`` reads the OCI state
from FILE instead of stdin).
"""

from __future__ import annotations

from nvshim.errors import UsageError, did_you_mean, empty_path
from nvshim.hookentries import FINISHERS, STEP_SEPARATOR

TOOL = "nvshim-hook"

# step -> (help, {option: (kind, metavar, help)}, positional names)
# kind "list": repeatable, collected in order; "one": a single value (last one wins)
STEPS: dict[str, tuple[str, dict[str, tuple[str, str, str]], tuple[str, ...]]] = {
    "create-symlinks": (
        "create symlinks in the container root",
        {"--link": ("list", "TARGET::LINK", "a symlink LINK pointing at TARGET")},
        (),
    ),
    "chmod": (
        "set the mode of paths in the container root",
        {
            "--path": ("list", "PATH", "a container path whose mode is set"),
            "--mode": ("one", "MODE", "the octal mode"),
        },
        (),
    ),
    "enable-cuda-compat": (
        "use the image's CUDA forward-compatibility libraries when newer than the driver",
        {
            "--host-driver-version": ("one", "VERSION", "the host driver version"),
            "--host-cuda-version": ("one", "VERSION", "the newest CUDA the host driver supports"),
            "--cuda-compat-container-root": (
                "one",
                "DIR",
                "the compat libraries' folder  [default: /usr/local/cuda/compat]",
            ),
        },
        (),
    ),
    "update-application-profile": (
        "limit EGL/Vulkan to the container's GPUs (a driver application profile)",
        {},
        (),
    ),
    "update-ldcache": (
        "make library folders visible to ld.so",
        {
            "--folder": ("list", "DIR", "a container folder with injected libraries"),
            "--ldconfig": (
                "one",
                "FILE",
                "the host's static ldconfig (where the cache cannot"
                " be added to)  [default: /sbin/ldconfig]",
            ),
            "--ldconfig-path": ("one", "FILE", "NVIDIA's name of --ldconfig"),
        },
        (),
    ),
    "disable-device-node-modification": (
        "mount a copy of /proc/driver/nvidia/params with ModifyDeviceFiles: 0",
        {},
        (),
    ),
    "prestart": ("standalone mode: apply a GPU request's edits", {}, ()),
    "mps-check": (
        "refuse the container when the MPS daemon of a shared device is down (CDI specs)",
        {},
        ("uuid",),
    ),
    "require-check": (
        "refuse the container when its NVIDIA_REQUIRE_* do not hold (DRA claim specs)",
        {
            "--cuda": ("one", "VERSION", "the newest CUDA the host driver supports"),
            "--driver": ("one", "VERSION", "the host driver version"),
            "--device": ("list", "CC:BRAND", "a device's compute capability and brand"),
        },
        (),
    ),
    "rdma-pair": (
        "claim paired RDMA NICs, move their netdevs into the container's netns (createRuntime)",
        {
            "--claim": ("list", "HCA", "claim this NIC for the container (pairing.exclusive)"),
            "--netdev": ("list", "OLD[=NEW]", "move this netdev in (renamed NEW)"),
        },
        (),
    ),
    "finish": (
        f"run several finishing steps in one process: STEP ARGS [{STEP_SEPARATOR} STEP ARGS]...",
        {},
        (),
    ),
}
CONFIG_HELP = "The nvshim config file.  [env var: NVSHIM_CONFIG; default: /etc/nvshim/config.toml]"
# Options every step takes: NVIDIA's ``--container-spec`` (its hooks take it too)
STATE_OPTION = {"--container-spec": ("one", "FILE", "read the OCI state from FILE, not stdin")}
# NVIDIA's global flags, accepted and ignored (``--flag`` or ``--flag=BOOL``)
IGNORED_FLAGS = ("-d", "--debug", "--quiet")
# the word of NVIDIA's ``nvidia-ctk hook NAME`` form
HOOK_WORD = "hook"
LOG_FORMATS = ("text", "json")


class HookArgs:
    """A parsed command line: ``command``, ``config`` and the step's options."""

    def __init__(self, command: str, config: str | None = None) -> None:
        self.command = command
        self.config = config
        self.log_format: str | None = None
        self.link: list[str] = []
        self.folder: list[str] = []
        self.ldconfig: str | None = None
        self.uuid: str | None = None
        self.steps: list[str] = []
        self.claim: list[str] = []
        self.netdev: list[str] = []
        self.cuda: str | None = None
        self.driver: str | None = None
        self.device: list[str] = []
        self.path: list[str] = []
        self.mode: str | None = None
        self.host_driver_version: str | None = None
        self.host_cuda_version: str | None = None
        self.cuda_compat_container_root: str | None = None
        self.container_spec: str | None = None

    def __repr__(self) -> str:
        return f"HookArgs({self.command!r}, config={self.config!r})"


class HelpRequested(Exception):
    """``--help`` or ``--version``: print ``text`` and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _usage_error(message: str, step: str | None = None) -> UsageError:
    """A usage error; ``step``: the step whose help says how to fix it."""
    error = UsageError(message)
    error.help_command = f"{TOOL} {step}" if step else TOOL
    return error


def parse_args(argv: list[str]) -> HookArgs:
    """Parse a full command line (without the program name)."""
    config = log_format = None
    i = 0
    while i < len(argv) and (argv[i].startswith("-") or argv[i] == HOOK_WORD):
        if argv[i] == HOOK_WORD or _ignored_flag(argv[i]):
            i += 1
            continue
        if argv[i] == "--version":
            from nvshim import __version__

            raise HelpRequested(f"{TOOL} version {__version__}\n")
        name, value, i = _option(argv, i, "--config", "--log-format")
        if name in ("-h", "--help"):
            raise HelpRequested(help_text())
        if name == "--log-format":
            if value not in LOG_FORMATS:
                raise _usage_error(
                    f"invalid value for '--log-format': {value!r} is not one of 'text', 'json'"
                )
            log_format = value
        else:
            config = value
    if i >= len(argv):
        raise _usage_error("missing argument 'STEP'")
    args = parse_step(argv[i:])
    if args.config is None:
        args.config = config
    if args.config == "":  # not the default file in disguise
        error = empty_path("'--config'")
        error.help_command = TOOL
        raise error
    args.log_format = log_format
    return args


def parse_step(words: list[str]) -> HookArgs:
    """Parse ``STEP [OPTIONS]`` (one step of the command line or of ``finish``)."""
    command, rest = words[0], words[1:]
    if command not in STEPS:
        raise _usage_error(f"no such step {command!r}{did_you_mean(command, STEPS)}")
    _, options, positional = STEPS[command]
    args = HookArgs(command)
    if command == "finish":
        if rest[:1] in (["-h"], ["--help"]):
            raise HelpRequested(help_text(command))
        args.steps = list(rest)
        return args
    wanted = list(positional)
    i = 0
    while i < len(rest):
        word = rest[i]
        if _ignored_flag(word):
            i += 1
            continue
        if not word.startswith("-") or word == "-":
            if not wanted:
                raise _usage_error(f"got unexpected extra argument ({word})", command)
            setattr(args, wanted.pop(0), word)
            i += 1
            continue
        name, value, i = _option(rest, i, "--config", *STATE_OPTION, *options, step=command)
        if name in ("-h", "--help"):
            raise HelpRequested(help_text(command))
        if name == "--config":
            args.config = value
        elif name == "--ldconfig-path":
            args.ldconfig = value
        elif name in STATE_OPTION or options[name][0] == "one":
            setattr(args, name[2:].replace("-", "_"), value)
        else:
            getattr(args, name[2:]).append(value)
    if wanted:
        raise _usage_error(f"missing argument {wanted[0].upper()!r}", command)
    return args


def _ignored_flag(word: str) -> bool:
    """NVIDIA's ``-d``, ``--debug``, ``--quiet`` (also ``=true``/``=false``)."""
    name, eq, value = word.partition("=")
    return name in IGNORED_FLAGS and (not eq or value.lower() in ("true", "false", "1", "0"))


def _option(
    words: list[str], i: int, *known: str, step: str | None = None
) -> tuple[str, str | None, int]:
    """The option at ``words[i]``: (name, value, index after it). ``-h``/``--help`` have
    no value; the others in ``known`` need one."""
    name, eq, value = words[i].partition("=")
    if name in ("-h", "--help") and not eq:
        return name, None, i + 1
    if name not in known:
        raise _usage_error(f"no such option {name!r}{did_you_mean(name, known)}", step)
    if eq:
        return name, value, i + 1
    if i + 1 >= len(words):
        raise _usage_error(f"option {name!r} requires an argument", step)
    return name, words[i + 1], i + 2


def parse_finish(words: list[str]) -> list[HookArgs]:
    """The finishing steps of a ``finish`` command line (``STEP_SEPARATOR`` between)."""
    steps: list[HookArgs] = []
    current: list[str] = []
    for word in [*words, STEP_SEPARATOR]:
        if word != STEP_SEPARATOR:
            current.append(word)
            continue
        if not current:
            continue
        if current[0] not in FINISHERS:
            raise _usage_error(
                f"finish: {current[0]!r} is not a finishing step ({', '.join(FINISHERS)})", "finish"
            )
        steps.append(parse_step(current))
        current = []
    return steps


def help_text(step: str | None = None) -> str:
    """``--help`` output for the tool or one step, laid out as click lays out ``nvshim``'s."""
    helps = [("-h, --help", "Show this message and exit.")]
    if step is not None:
        summary, options, positional = STEPS[step]
        words = [p.upper() for p in positional]
        rows = [("--config FILE", CONFIG_HELP)]
        rows += [
            (f"{name} {meta}", f"{text}; repeatable" if kind == "list" else text)
            for name, (kind, meta, text) in options.items()
        ]
        rows += [(f"{name} {meta}", text) for name, (_, meta, text) in STATE_OPTION.items()]
        usage = f"Usage: {TOOL} {step} [OPTIONS] {' '.join(words)}".rstrip()
        return _page(usage, summary[:1].upper() + summary[1:] + ".", [("Options", rows + helps)])
    steps = [(name, summary) for name, (summary, _, _) in STEPS.items()]
    rows = [
        ("--config FILE", CONFIG_HELP),
        ("--log-format [text|json]",
         "The decision log's format.  [default: the config's runtime.log-format]"),
        ("--version", "Show the version and exit."),
        *helps,
    ]  # fmt: skip
    about = (
        "OCI hook for GPU containers; reads the OCI state JSON on stdin. NVIDIA's CDI hook"
        " lines run as they are: `hook STEP ...` (nvidia-ctk's form), -d/--debug/--quiet"
        " accepted; each step takes --container-spec FILE."
    )
    return _page(
        f"Usage: {TOOL} [OPTIONS] STEP [ARGS]...", about, [("Options", rows), ("Steps", steps)]
    )


def _page(usage: str, about: str, sections: list[tuple[str, list[tuple[str, str]]]]) -> str:
    """A help page: usage, the description, then each section's two columns."""
    import textwrap

    lines = [usage, "", *textwrap.wrap(about, 76, initial_indent="  ", subsequent_indent="  ")]
    for title, rows in sections:
        width = min(max(len(left) for left, _ in rows), 30) + 2
        lines += ["", f"{title}:"]
        for left, text in rows:
            wrapped = textwrap.wrap(text[:1].upper() + text[1:], 78 - width - 2) or [""]
            if len(left) + 2 > width:
                lines.append(f"  {left}")
                lines += [f"  {'':<{width}}{w}" for w in wrapped]
            else:
                lines.append(f"  {left:<{width}}{wrapped[0]}")
                lines += [f"  {'':<{width}}{w}" for w in wrapped[1:]]
    return "\n".join(lines) + "\n"
