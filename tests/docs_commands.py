"""The shell commands of README.md and docs/*.md, read from the pages, and the sandbox that
runs them as written (tests/test_docs_commands.py).

A command is a line of a fenced block whose language is a shell (``sh``, ``bash``,
``shell``, ``console``) or, in a block of any other kind, a line after a ``$ `` prompt
(then only those lines are commands); ``#`` lines are comments or shown output; a line
ending in ``\\`` goes on on the next. A block no test may run is preceded by the page's
own reason, one marker per line right above the fence::

    <!-- not run by tests: needs a real GPU -->                   (the whole block)
    <!-- not run by tests: `systemctl`, `apt install`: on the host -->   (those commands)

The sandbox is a private mount namespace (and network namespace) whose ``/etc``,
``/usr``, ``/run``, ``/var``, ``/opt``, ``/tmp`` and checkout are overlays on the host's: a
command writes ``/etc/nvshim/config.toml``, ``/var/run/cdi/nvidia.yaml`` or ``dist/`` as
written, and neither the host nor the checkout sees it. Its ``/etc/nvshim/config.toml``
names a simulated host.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)
FENCE = re.compile(r"^\s*(```|~~~)")
SHELLS = {"sh", "bash", "shell", "console"}
MARKER = re.compile(r"^<!-- not run by tests: (.+?) -->\s*$")
PROMPT = "$ "


def pages(repo: str = REPO) -> list[str]:
    """README.md and every docs/*.md page, as absolute paths."""
    return [os.path.join(repo, "README.md"), *sorted(glob.glob(os.path.join(repo, "docs", "*.md")))]


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its text, and the page's reason not to run
    it (None: a test runs it)."""

    page: str  # relative to the repository, e.g. docs/commands.md
    line: int  # 1-based line of its first line
    text: str  # continuation lines joined, the trailing comment dropped
    reason: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def strip_comment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` at a word start, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def covered(reasons: list[str], text: str) -> str | None:
    """The reason among the markers ``reasons`` that covers command ``text``."""
    for reason in reasons:
        found = re.match(r"((?:`[^`]+`(?:, )?)+): (.+)$", reason)
        if not found:
            return reason
        prefixes = re.findall(r"`([^`]+)`", found.group(1))
        if any(text.startswith(p) for p in prefixes):
            return found.group(2)
    return None


def block_commands(page: str, start: int, lang: str, body: list[str], reasons: list[str]):
    """The commands of one fenced block whose first body line is line ``start``."""
    prompted = any(b.startswith(PROMPT) for b in body)
    if not prompted and lang not in SHELLS:
        return []
    out, pending, first = [], "", 0
    for number, raw in enumerate(body, start):
        if not pending:
            if prompted and not raw.startswith(PROMPT):
                continue
            raw = raw.removeprefix(PROMPT) if prompted else raw
            first = number
        text = strip_comment(raw)
        if text.endswith("\\"):
            pending += text[:-1].strip() + " "
            continue
        text = (pending + text.strip()).strip()
        pending = ""
        if text:
            out.append(Command(page, first, text, covered(reasons, text)))
    return out


def page_commands(path: str, repo: str = REPO) -> list[Command]:
    """Every command of the page at ``path``."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    page = os.path.relpath(path, repo)
    out, at = [], 0
    while at < len(lines):
        opened = FENCE.match(lines[at])
        if not opened:
            at += 1
            continue
        end = next(i for i in range(at + 1, len(lines)) if FENCE.match(lines[i]))
        reasons, above = [], at - 1
        while above >= 0 and MARKER.match(lines[above]):
            reasons.insert(0, MARKER.match(lines[above]).group(1))
            above -= 1
        lang = lines[at].strip().lstrip("`~").strip().split(" ")[0]
        out += block_commands(page, at + 2, lang, lines[at + 1 : end], reasons)
        at = end + 1
    return out


def all_commands(repo: str = REPO) -> list[Command]:
    return [c for path in pages(repo) for c in page_commands(path, repo)]


# a program nvshim ships, by name or path: ``nvshim``, ``.venv/bin/nvshim``, ``/opt/...``
INLINE = re.compile(r"^(?:\S*/)?(nvshim|nvshim-hook|nvshim-runtimed)$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)
# what makes a span a synopsis or a sketch rather than a command line
SKETCH = re.compile(r"\.\.\.|…|<[^>]*>|\[|\||\\")


SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {"<", ">", ">>", ">&", "<&", "&>"}


def program_lines(text: str) -> list[tuple[str, list[str]]]:
    """Each run of nvshim's programs in the shell line ``text`` that has a subcommand or an
    option: (the part as written, its argv with the program's bare name first); ``&&``,
    ``;``, ``|`` and ``&`` separate parts, redirections are left out, and so are ``sudo``,
    ``chroot DIR`` and variables set before the program."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(token)
    out = []
    for part in parts:
        argv, skip = [], False
        for at, token in enumerate(part):
            if skip:
                skip = False
            elif token in REDIRECTS:
                skip = True
            elif not (token.isdigit() and part[at + 1 : at + 2] and part[at + 1] in REDIRECTS):
                argv.append(token)
        shown = " ".join(part)
        while argv and (argv[0] in ("sudo", "chroot") or ASSIGNMENT.match(argv[0])):
            argv = argv[2:] if argv[0] == "chroot" else argv[1:]
        program = INLINE.match(argv[0]) if argv else None
        if program and len(argv) > 1:
            out.append((shown, [program.group(1), *argv[1:]]))
    return out


def inline_spans(path: str, repo: str = REPO) -> list[Command]:
    """The page's inline code spans outside fenced blocks (blanks folded)."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    fenced, inside = [], False
    for line in lines:
        opens = bool(FENCE.match(line))
        fenced.append("" if inside or opens else line)
        inside ^= opens
    text = "\n".join(fenced)
    page = os.path.relpath(path, repo)
    return [
        Command(page, text.count("\n", 0, found.start()) + 1, " ".join(found.group(2).split()))
        for found in SPAN.finditer(text)
    ]


def inline_commands(path: str, repo: str = REPO) -> list[tuple[Command, list[str]]]:
    """The runs of nvshim's programs (``program_lines``) in the page's inline code spans;
    spans with ``...``, ``<x>``, ``[x]`` or ``a|b`` are synopses (``synopsis_lines``)."""
    return [
        (Command(span.page, span.line, shown), argv)
        for span in inline_spans(path, repo)
        if not SKETCH.search(span.text)
        for shown, argv in program_lines(span.text)
    ]


def all_program_lines(repo: str = REPO) -> list[tuple[Command, list[str]]]:
    """Every run of nvshim's programs in the pages: inline spans, and the lines of fenced
    blocks (those the page says no test runs included)."""
    out = [c for path in pages(repo) for c in inline_commands(path, repo)]
    for command in all_commands(repo):
        if not SKETCH.search(command.text):
            out += [(command, argv) for _, argv in program_lines(command.text)]
    return out


def synopsis_lines(repo: str = REPO) -> list[Command]:
    """The synopses of nvshim's programs in the pages (``nvshim cdi list [--json]``): spans
    and fenced lines that start with a program and hold ``...``, ``<x>``, ``[x]`` or ``a|b``."""
    found = [s for path in pages(repo) for s in inline_spans(path, repo)]
    found += all_commands(repo)
    return [
        c for c in found
        if SKETCH.search(c.text) and INLINE.match(c.text.split(" ", 1)[0]) and " " in c.text
    ]  # fmt: skip


def documented(page: str, prefix: str) -> str:
    """The one command of ``page`` (e.g. docs/install.md) that starts with ``prefix``, as
    written: for a test that runs it."""
    path = os.path.join(REPO, page)
    (text,) = [c.text for c in page_commands(path) if c.text.startswith(prefix)]
    return text


def synopses(repo: str = REPO) -> list[str]:
    """The fixed words of each synopsis in docs/commands.md's "All commands" table: up to
    the first option group, placeholder or alternative (``nvshim mps start|stop`` gives
    ``nvshim mps``)."""
    with open(os.path.join(repo, "docs", "commands.md"), encoding="utf-8") as fh:
        table = fh.read().split("## All commands", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in table.splitlines()[3:]:
        first = re.split(r"(?<!\\)\|", row)[1] if row.startswith("|") else ""
        for cell in re.findall(r"`([^`]+)`", first):
            words = []
            for word in cell.replace("\\|", "|").split():
                if re.search(r"[\[<|]|\.\.\.", word) or word.isupper():
                    break
                words.append(word)
            out.append(" ".join(words))
    return out


# -- the sandbox --------------------------------------------------------------------------

OVERLAID = ("etc", "usr", "run", "var", "opt", "tmp")
# a fresh machine: none of nvshim's files, no engine config, no running engine
FRESH = (
    "/etc/nvshim /etc/cdi /run/cdi /etc/containerd /etc/docker /etc/crio /run/nvshim "
    "/run/containerd /run/crio /run/docker /run/docker.sock /run/nvidia /usr/local/nvshim "
    "/tmp/nvshim-bundle /tmp/stage"
)
BEGIN, END = "\n@@nvshim-docs begin ", "\n@@nvshim-docs end "


@dataclass(frozen=True)
class Step:
    """What the sandbox does for one command: ``before`` and ``after`` are shell run around
    it (their output is the command's too); ``daemon``: the command runs in the background,
    ``after`` waits for it to serve, then it is stopped with SIGTERM."""

    before: str = ""
    after: str = ""
    daemon: bool = False


def sandbox_script(
    work: str, config: str, steps: list[tuple[str, Step]], env: dict, cleanup: str = ":"
) -> str:
    """The bash script that runs ``steps`` (command, Step) in order in the sandbox, then
    ``cleanup`` (however it ends)."""
    q = shlex.quote
    lines = ["set -u", f"trap {q(cleanup)} EXIT", "ip link set lo up 2>/dev/null"]
    # the checkout first: an upper directory must not be on an overlay (/tmp's)
    for name, top in [("checkout", REPO), *((t, f"/{t}") for t in OVERLAID)]:
        upper, scratch = f"{work}/overlay/{name}", f"{work}/overlay/{name}.work"
        lines.append(
            f"mkdir -p {q(upper)} {q(scratch)} && mount -t overlay overlay "
            f"-o lowerdir={q(top)},upperdir={q(upper)},workdir={q(scratch)} {q(top)} || exit 90"
        )
    lines += [
        f"rm -rf {FRESH}",
        f"mkdir -p /etc/nvshim && cp {q(config)} /etc/nvshim/config.toml",
        *(f"export {k}={q(v)}" for k, v in env.items()),
        f"export PATH={q(VENV_BIN)}:$PATH",
        f"cd {q(REPO)}",
        "out=$(mktemp)",
    ]
    for index, (command, step) in enumerate(steps):
        background = step.daemon and not command.endswith("&")
        body = f"{{ {command} & }}" if background else f"{{ {command}\n}}"
        lines += [
            f"printf '{BEGIN.strip()} {index}\\n'",
            ": >$out",
            f"{{ {step.before}\n}} </dev/null >>$out 2>&1" if step.before else ":",
            f"{body} </dev/null >>$out 2>&1",
            "rc=$?; pid=$!" if step.daemon else "rc=$?",
            f"{{ {step.after}\n}} </dev/null >>$out 2>&1" if step.after else ":",
        ]
        if step.daemon:
            lines.append('kill -TERM "$pid"; wait "$pid"; rc=$?')
        lines += ["cat $out", f"printf '{END.strip()} {index} %d\\n' $rc"]
    return "\n".join(lines) + "\n"


def run_sandbox(work: str, config: str, steps: list[tuple[str, Step]], env: dict,
                cleanup: str = ":", net: bool = True,
                timeout: float = 240) -> list[tuple[int, str]]:  # fmt: skip
    """(exit code, output) of each step's command, run in order in one sandbox."""
    script = sandbox_script(work, config, steps, env, cleanup)
    argv = ["unshare", "--mount", "--propagation", "private", *(["--net"] if net else [])]
    proc = subprocess.run(
        [*argv, "bash", "-c", script], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode != 90, f"no overlay mounts: {proc.stderr}"
    results = []
    for index in range(len(steps)):
        found = re.search(
            rf"{BEGIN.strip()} {index}\n(.*?)\n?{END.strip()} {index} (\d+)\n",
            proc.stdout,
            re.S,
        )
        if found is None:
            results.append((-1, f"not reached: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"))
        else:
            results.append((int(found.group(2)), found.group(1)))
    return results
