"""The CLI convention of docs/commands.md "Conventions", held for every command of
``nvshim`` (a walk of the click tree), ``nvshim-hook`` (each step) and ``nvshim-runtimed``:
each shown option described, one help notation for variables and defaults, no
reStructuredText markup, one name per thing, each command's own options only; and the
exit codes table, by running each program into a usage error, a failure and an I/O error."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest

from nvshim.cli import cli
from nvshim.hook.args import STEPS, HelpRequested, parse_args
from nvshim.options import Option
from tests.conftest import REPO, run_nvshim
from tests.runc_util import write_hook_config

COMMANDS_PAGE = os.path.join(REPO, "docs", "commands.md")
# the one bracket closing a description: [env var: A, B; default: X]
EXTRA = re.compile(r"\[(env var: [A-Z0-9_<>]+(, [A-Z0-9_<>]+)*)?(; )?(default: [^\[\]]+)?\]$")
# other ways of writing a default, and brackets anywhere else
OTHER_DEFAULTS = re.compile(r"\(default|\bdefaults? to\b|default:|\[|\]", re.IGNORECASE)
# names that mean something else in nvshim (docs/commands.md "Conventions")
NOT_SHOWN = ("--runtime", "--config", "--spec-dir")


def _commands(cmd: click.Command = cli, path: tuple[str, ...] = ("nvshim",)):
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1])
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def _shown(cmd: click.Command, path) -> list[tuple[str, str]]:
    """(spec, description) of each option ``--help`` shows."""
    ctx = click.Context(cmd, info_name=" ".join(path))
    records = (p.get_help_record(ctx) for p in cmd.get_params(ctx) if isinstance(p, click.Option))
    return [r for r in records if r is not None]


def _check_description(where: str, text: str) -> None:
    text = " ".join(text.split())
    assert text, f"{where}: no description"
    bracket = EXTRA.search(text)
    body = text[: bracket.start()] if bracket else text
    assert not OTHER_DEFAULTS.search(body), f"{where}: write [env var: ...; default: ...]: {text}"
    assert "``" not in text, f"{where}: reStructuredText markup"


def _hook_pages() -> dict[str, str]:
    pages = {}
    for argv in (["--help"], *([step, "--help"] for step in STEPS)):
        with pytest.raises(HelpRequested) as shown:
            parse_args(argv)
        pages[" ".join(["nvshim-hook", *argv[:-1]])] = shown.value.text
    return pages


def _page_rows(page: str) -> list[tuple[str, str]]:
    """(spec, description) of the Options section of a help page (click's layout)."""
    section = page.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    rows: list[tuple[str, str]] = []
    for line in section.splitlines():
        spec, _, text = line.strip().partition("  ")
        if line.startswith("  -"):
            rows.append((spec, text.strip()))
        elif rows:
            rows[-1] = (rows[-1][0], f"{rows[-1][1]} {line.strip()}".strip())
    return rows


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_describes_every_option_in_one_notation(path, cmd, capsys):
    for spec, text in _shown(cmd, path):
        where = f"{' '.join(path)} {spec}"
        _check_description(where, text)
        assert spec.split()[0].rstrip(",") not in NOT_SHOWN, f"{where}: another tool's name"
    plain = [
        p.opts[0]
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and p.name not in ("help", "version")
        and not isinstance(p, Option)
    ]  # fmt: skip
    assert plain == [], f"{' '.join(path)}: options not in nvshim.cli.common.option's notation"
    with pytest.raises(SystemExit) as done:
        cli.main([*path[1:], "--help"], prog_name="nvshim")
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"Usage: {' '.join(path)} ")
    assert "``" not in shown, "reStructuredText markup in the help"


def test_the_walk_reaches_every_command():
    names = {" ".join(p) for p, _ in COMMANDS}
    for expected in ("nvshim cdi generate", "nvshim dra run", "nvshim node install",
                     "nvshim unconfigure", "nvshim mps status"):  # fmt: skip
        assert expected in names


def test_the_hook_and_the_daemon_help_in_the_same_notation(launchers):
    pages = _hook_pages()
    proc = subprocess.run([f"{launchers}/nvshim-runtimed", "--help"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pages["nvshim-runtimed"] = proc.stdout
    for name, page in pages.items():
        assert page.startswith(f"Usage: {name} "), page
        rows = _page_rows(page)
        assert rows and rows[-1][0] == "-h, --help", f"{name}: {rows}"
        for spec, text in rows:
            _check_description(f"{name} {spec}", text)
    assert "--config FILE" in pages["nvshim-hook"]  # the hook's --config: nvshim's own config
    assert "[env var: NVSHIM_CONFIG; default: /etc/nvshim/config.toml]" in " ".join(
        pages["nvshim-hook"].split()
    )
    assert "--ldconfig FILE" in pages["nvshim-hook update-ldcache"]
    assert "--folder" not in pages["nvshim-hook mps-check"], "a step shows only its options"


def _options(path: str) -> set[str]:
    cmd = dict((" ".join(p), c) for p, c in COMMANDS)[path]
    return {spec.split()[0].rstrip(",") for spec, _ in _shown(cmd, path.split())}


def test_each_command_lists_only_its_own_options():
    configure_only = {"--set-as-default", "--enable-cdi", "--config-source",
                      "--runtime-config-override", "--take-over"}  # fmt: skip
    configure, unconfigure = _options("nvshim configure"), _options("nvshim unconfigure")
    assert configure - unconfigure == configure_only
    assert unconfigure <= configure
    assert "--keep" not in _options("nvshim node install")  # it never uninstalls
    for path in ("nvshim node run", "nvshim node uninstall", "nvshim node show"):
        assert "--keep" in _options(path), path
        assert _options(path) - {"--keep"} == _options("nvshim node install"), path


def test_one_name_and_one_metavar_per_thing():
    """Each option name means one thing everywhere: the same metavar in every command,
    and every name of the conventions table shown by some command."""
    metavars: dict[str, set[str]] = {}
    for path, cmd in COMMANDS:
        for spec, _ in _shown(cmd, path):
            name, _, meta = spec.partition(" ")
            metavars.setdefault(name.rstrip(","), set()).add(meta)
    for name in ("--engine", "--engine-config", "--socket", "--cdi-dir", "--hooks-dir",
                 "--driver-root", "--dev-root", "--host-root", "--runtime-name"):  # fmt: skip
        assert len(metavars[name]) == 1, f"{name}: {metavars[name]}"
    hook = " ".join(_hook_pages().values())
    page = open(COMMANDS_PAGE).read().split("\n## Conventions\n", 1)[1]
    table = page.split("**Option names.**", 1)[1].split("\n\n", 2)[1]
    for row in table.splitlines()[2:]:
        for name in re.findall(r"`(--[a-z-]+)", row.split("|")[1]):
            assert name in metavars or f"{name} " in hook, f"docs/commands.md: {name}"


def test_every_program_prints_its_version_alike(launchers):
    shown = [run_nvshim("--version").stdout]
    for program in ("nvshim-hook", "nvshim-runtimed"):
        shown.append(_run([f"{launchers}/{program}", "--version"]).stdout)
    names = [line.split(" version ")[0] for line in shown]
    assert names == ["nvshim", "nvshim-hook", "nvshim-runtimed"], shown
    assert len({line.split(" version ")[1] for line in shown}) == 1, shown


def test_nvidia_ctk_names_still_work_unshown(tmp_path):
    config = tmp_path / "daemon.json"
    argv = ["configure", "--runtime", "docker", "--config", str(config), "--dry-run"]
    proc = run_nvshim(*argv)
    assert proc.returncode == 0 and str(config) in proc.stdout, proc.stderr
    assert config.exists() is False
    proc = run_nvshim("cdi", "list", "--spec-dir", str(tmp_path), "--json")
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def _exit_codes() -> dict[int, str]:
    page = open(COMMANDS_PAGE).read().split("**Exit codes.**", 1)[1]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", page, re.MULTILINE)
    return {int(code): meaning for code, meaning in rows}


def _one_error(proc, program: str, *words: str) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{program}: error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def test_exit_codes_are_the_documented_ones(launchers, tmp_path):
    """Each program into a usage error (2), a failure (1) and an I/O error (1, naming
    the path), with the table of docs/commands.md saying the same."""
    table = _exit_codes()
    assert {0, 1, 2} <= set(table) and table[2].startswith("usage")
    assert "I/O" in table[1] and "failed" in table[1]
    config, log = write_hook_config(tmp_path)  # the hook's decision log: here
    hook, daemon = f"{launchers}/nvshim-hook", f"{launchers}/nvshim-runtimed"
    missing = tmp_path / "missing" / "file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    usage = {
        "nvshim": run_nvshim("configure", "--dry-ru"),
        "nvshim-hook": _run([hook, "update-ldcache", "--config", config, "--foldr", "/x"]),
        "nvshim-runtimed": _run([daemon, "--worker", "3"]),
    }
    for program, proc in usage.items():
        assert proc.returncode == 2, (program, proc.stderr)
        line = _one_error(proc, program, "no such option")
        assert re.search(
            r" \(did you mean (one of: )?'--[a-z-]+'(, '--[a-z-]+')*\?\); try '[a-z -]+ --help'$",
            line,
        ), line
    failure = {
        "nvshim": run_nvshim("cdi", "validate", str(bad)),
        "nvshim-hook": _run([hook, "prestart", "--config", config], input="{}"),
        "nvshim-runtimed": _run([daemon, "--idle-timeout", "1"],
                                env={**os.environ, "NVSHIM_CACHE_DIR": str(blocker / "c")}),
    }  # fmt: skip
    for program, proc in failure.items():
        assert proc.returncode == 1, (program, proc.stderr)
        assert proc.stderr.splitlines()[-1].startswith(f"{program}: error: "), proc.stderr
    io_error = {
        "nvshim": run_nvshim(
            "configure", "--engine", "docker", "--engine-config", str(blocker / "daemon.json")
        ),  # fmt: skip
        "nvshim-hook": _run(
            [hook, "prestart", "--config", config, "--container-spec", str(missing)]
        ),  # fmt: skip
        "nvshim-runtimed": failure["nvshim-runtimed"],  # its cache directory: not a directory
    }
    for program, proc in io_error.items():
        assert proc.returncode == 1, (program, proc.stderr)
        assert str(missing if program == "nvshim-hook" else blocker) in proc.stderr, proc.stderr
    assert blocker.read_text() == ""
    assert str(missing) in open(log).read()  # the hook's failures are logged decisions too


def test_a_bad_input_file_exits_1_naming_it(launchers, tmp_path):
    """A bad file is a failure of the work (1), never a usage error (2), whichever file
    and whichever program: one line ``PROGRAM: error: FILE...``, every file as it was."""
    files = {
        "containerd.toml": "version = 2\n[plugins\n",
        "daemon.json": '{\n  "runtimes": ["nvidia"]\n}\n',
        "config.toml": "[host\n",
        "sharing.yaml": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replica: 4}\n",
        "names-sharing.toml": f'[sharing]\nconfig = "{tmp_path}/sharing.yaml"\n',
    }  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = {name: str(tmp_path / name) for name in files}
    hook = f"{launchers}/nvshim-hook"
    runs = [
        ("containerd.toml", "nvshim", run_nvshim(
            "configure", "--engine", "containerd", "--engine-config", path["containerd.toml"])),
        ("daemon.json", "nvshim", run_nvshim(
            "unconfigure", "--engine", "docker", "--engine-config", path["daemon.json"])),
        ("config.toml", "nvshim", run_nvshim(
            "config", "show", env={"NVSHIM_CONFIG": path["config.toml"]})),
        ("sharing.yaml", "nvshim", run_nvshim(
            "config", "show", env={"NVSHIM_CONFIG": path["names-sharing.toml"]})),
        ("config.toml", "nvshim-hook", _run(
            [hook, "update-ldcache", "--config", path["config.toml"], "--folder", "/x"])),
    ]  # fmt: skip
    for name, program, proc in runs:
        assert proc.returncode == 1, (name, program, proc.stderr)
        line = _one_error(proc, program)
        assert line.startswith(f"{program}: error: {path[name]}"), line
        assert "--help" not in line, line  # the fix is in the file, not the command line
    assert {n: (tmp_path / n).read_text() for n in files} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # no backup, no lock
    assert "never the contents of a file" in _exit_codes()[2]


def test_usage_errors_a_command_raises_end_as_the_parser_s(tmp_path):
    """Usage errors found inside a command (not by its parser) say where the help is, as
    the parser's do, whichever path the command line took (the cdi generate fast path,
    nvidia-ctk's ``runtime configure``, a group's subcommand)."""
    config = str(tmp_path / "config.toml")
    cases = [
        (run_nvshim("configure"), "nvshim configure",
         "--engine is required: containerd, docker or crio"),
        (run_nvshim("node", "install", env={"NVSHIM_ENGINE": "dockr"}), "nvshim node install",
         "NVSHIM_ENGINE='dockr'"),
        (run_nvshim("cdi", "generate", "--vendor", "x y"), "nvshim cdi generate",
         '--vendor "x y": character " " is not allowed'),
        (run_nvshim("cdi", "refresh", "-o", f"{tmp_path}/s.yaml", "--class", "-c"),
         "nvshim cdi refresh", '--class "-c": must start with a letter'),
        (run_nvshim("runtime", "configure", "--runtime", "containerd", "--config", config,
                    "--nvidia-runtime-name", "runc"), "nvshim runtime configure", "runc"),
        (run_nvshim("--quiet", "unconfigure", "--engine", "docker", "--runtime-name", "a b"),
         "nvshim unconfigure", "--runtime-name 'a b'"),
        (run_nvshim("doctor", "--only", "engine-loadd"), "nvshim doctor",
         "--only engine-loadd: no such check (did you mean 'engine-loaded'?); known: driver,"),
    ]  # fmt: skip
    for proc, command, words in cases:
        assert proc.returncode == 2, (command, proc.stderr)
        line = _one_error(proc, "nvshim", words)
        assert line.endswith(f"; try '{command} --help'"), line
    assert not os.path.exists(config) and not os.path.exists(tmp_path / "s.yaml")
    assert cases[0][0].stderr.strip() in _message_examples()


def _message_examples() -> list[str]:
    """The lines of docs/commands.md's "Messages" example block."""
    page = open(COMMANDS_PAGE).read().split("**Messages.**", 1)[1]
    return page.split("```\n", 2)[1].splitlines()


def test_the_documented_messages_are_the_programs_own(launchers):
    shown = [
        run_nvshim("configure", "--dry-ru").stderr.strip(),
        _run([f"{launchers}/nvshim-hook", "prestat"]).stderr.strip(),
        _run([f"{launchers}/nvshim-runtimed", "--workers", "0"]).stderr.strip(),
    ]
    for line in shown:
        assert line in _message_examples(), line


def test_usage_errors_name_the_flag_or_variable():
    proc = run_nvshim("configure", env={"NVSHIM_ENGINE": "dockr"})
    assert proc.returncode == 2
    line = _one_error(proc, "nvshim", "NVSHIM_ENGINE 'dockr'", "containerd, docker, crio")
    assert line.endswith("; try 'nvshim configure --help'"), line
    proc = run_nvshim("unconfigure", "--engine", "dockr")
    assert proc.returncode == 2
    _one_error(proc, "nvshim", "'--engine'", "'dockr' is not one of")
    assert "'--runtime'" not in proc.stderr  # the hidden name is not offered
    proc = run_nvshim("--quiet", "cdi", "generate", "--format")  # click gives no command
    assert proc.returncode == 2
    line = _one_error(proc, "nvshim", "option '--format' requires an argument")
    assert line.endswith("; try 'nvshim cdi generate --help'"), line


@pytest.mark.parametrize(
    "argv, hint",
    [
        (("doctor", "--cdi-dir", ""), "'--cdi-dir'"),  # was checked as the directory ""
        (("cdi", "list", "--cdi-dir", ""), "'--cdi-dir'"),
        (("cdi", "refresh", "-o", ""), "'-o' / '--output'"),
        (("exporter", "--log-file", ""), "'--log-file'"),  # was the config's in disguise
        (("install", "--prefix", ""), "'--prefix'"),
        (("info", "--dev-root", ""), "'--dev-root'"),
        (("nvshim-hook", "--config", "", "prestart"), "'--config'"),  # was the default file
    ],
)
def test_an_empty_path_option_is_a_usage_error(launchers, tmp_path, argv, hint):
    """An option that names a file or directory, given as "": exit 2 naming it, and
    nothing read or written in its place."""
    if argv[0] == "nvshim-hook":
        proc = _run([f"{launchers}/nvshim-hook", *argv[1:]], input="{}", cwd=tmp_path)
        program, command = "nvshim-hook", "nvshim-hook"
    else:
        proc = run_nvshim(*argv, cwd=tmp_path, timeout=60)  # the exporter served on
        program, command = "nvshim", " ".join(("nvshim", *argv[:-2]))
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error(proc, program, f"invalid value for {hint}: empty path")
    assert line.endswith(f"; try '{command} --help'"), line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "value, words",
    [("-1", "must be 0 or more"), ("nan", "must be 0 or more"), ("inf", "must be finite")],
)
def test_exporter_doctor_interval_is_0_or_more(value, words):
    """A negative interval, nan or inf (after which the checks never ran again) is
    refused before anything is served."""
    argv = ("exporter", "--listen", "127.0.0.1:1", "--doctor-interval", value)
    proc = run_nvshim(*argv, timeout=30)
    assert proc.returncode == 2
    _one_error(proc, "nvshim", f"invalid value for '--doctor-interval': {value}: {words}")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_the_daemon_s_seconds_are_finite_and_above_0(launchers, value):
    """nvshim-runtimed's waits: inf was "never" (an idle worker kept for ever)."""
    proc = _run([f"{launchers}/nvshim-runtimed", "--idle-timeout", value])
    assert proc.returncode == 2, proc.stderr
    bound = "finite" if value == "inf" else "above 0"
    _one_error(proc, "nvshim-runtimed", f"'--idle-timeout': {value}: must be {bound}")


def test_nvshim_debug_takes_a_boolean_or_is_refused(tmp_path):
    """NVSHIM_DEBUG=garbage was "set" (tracebacks on): now a boolean as the other
    ``NVSHIM_*`` settings take them, anything else one line naming it before any work,
    on the click path and the ``cdi generate`` fast path alike."""
    out = tmp_path / "spec.yaml"
    for argv in (("config", "show"), ("cdi", "generate", "-o", str(out))):
        proc = run_nvshim(*argv, env={"NVSHIM_DEBUG": "garbage"})
        assert proc.returncode == 2, proc.stderr
        _one_error(proc, "nvshim", "NVSHIM_DEBUG='garbage': expected a boolean")
    assert os.listdir(tmp_path) == []
    for value in ("", "0", "false", "yes", "1"):
        proc = run_nvshim("config", "show", env={"NVSHIM_DEBUG": value})
        assert proc.returncode == 0 and proc.stderr == "", (value, proc.stderr)
