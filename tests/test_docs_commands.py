"""Every command of README.md and docs/*.md, read from the page (tests/docs_commands.py),
is in exactly one class:

- RUN: run here as written, in page order, in a sandbox that is a fresh machine (overlays
  on /etc, /usr, /run, /var, /opt, /tmp; /etc/nvshim/config.toml names a simulated host;
  kubectl talks to a real API server), its exit code and a piece of its output checked;
- ELSEWHERE: a named test reads that command from the page and runs it;
- SAME_PROGRAM: a named test runs the same program its own way (the one such command
  and why are listed there);
- NOT HERE: the page says why, in a marker right above the block.

Each synopsis of docs/commands.md's table has an example among the RUN or ELSEWHERE ones.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass

import click
import pytest

from nvshim.cli import cli
from nvshim.errors import UsageError
from nvshim.hook.args import IGNORED_FLAGS, STATE_OPTION, STEPS, HelpRequested, parse_args
from tests.conftest import REPO
from tests.docs_commands import (
    INLINE,
    Step,
    all_commands,
    all_program_lines,
    inline_commands,
    page_commands,
    pages,
    run_sandbox,
    synopses,
    synopsis_lines,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox mounts (root)")


@dataclass(frozen=True)
class Run:
    """How a RUN command is checked: its group (the sandbox it runs in), exit code, and a
    pattern its output matches (``absent``: one it must not)."""

    pattern: str
    code: int = 0
    group: str = "mig"
    step: Step = Step()
    absent: str | None = None


BUNDLE_DIR = "/path/to/bundle"  # commands.md's placeholder: the test's OCI bundle
EXPORTER = (
    "python3 -c 'import time, urllib.request as u\nfor _ in range(200):\n try:\n"
    '  print(u.urlopen("http://127.0.0.1:9400/metrics").read().decode()); break\n'
    " except OSError: time.sleep(0.05)'"
)
RUNTIMED = "for _ in $(seq 200); do [ -S /run/nvshim/runtime.sock ] && break; sleep 0.05; done"
CONTAINERD = (  # a real containerd on the documented socket (it exits on SIGHUP)
    "containerd --root /run/docs-containerd --state /run/containerd "
    "--address /run/containerd/containerd.sock >/dev/null 2>&1 & ctd=$!\n"
    "for _ in $(seq 300); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.05; done"
)
CONTAINERD_GONE = (
    "for _ in $(seq 200); do kill -0 $ctd 2>/dev/null || break; sleep 0.05; done\n"
    'kill -0 $ctd 2>/dev/null && echo "containerd still running" && kill $ctd; wait $ctd'
)

# (page, command as written) -> how it is checked
RUN = {
    ("docs/commands.md", "nvshim info"): Run(r"Driver 550\.90\.12 +CUDA 12\.4"),
    ("docs/commands.md", "nvshim info --topology"):
        Run(r"^GPU0 X +NV18(.*\n)*NIC legend:", group="rdma"),
    ("docs/commands.md", "nvshim cdi generate -o /var/run/cdi/nvidia.yaml"):
        Run(r"wrote /var/run/cdi/nvidia\.yaml: 33 devices"),
    ("docs/commands.md", "nvshim cdi generate --mode management --vendor management.nvidia.com "
                         "-o /var/run/cdi/management.nvidia.com-gpu.yaml"):
        Run(r"wrote /var/run/cdi/management\.nvidia\.com-gpu\.yaml: 1 devices"),
    ("docs/commands.md", "nvshim cdi generate --driver-root /run/nvidia/driver --capabilities all "
                         "--format json"):
        Run(r'"cdiVersion": "0\.5\.0"', step=Step(before="mkdir -p /run/nvidia/driver && "
                                                  'mount --bind "$SIM" /run/nvidia/driver')),
    ("docs/commands.md", "nvshim cdi list"):
        Run(r"management\.nvidia\.com/gpu=all\n(.*\n)*nvidia\.com/gpu=all", absent="warning"),
    ("docs/commands.md", "nvshim cdi validate /var/run/cdi/nvidia.yaml"): Run(r"1 spec\(s\) valid"),
    ("docs/commands.md", "nvshim cdi refresh"): Run(r"/var/run/cdi/nvidia\.yaml .*33 devices"),
    ("docs/commands.md", "nvshim config show"):
        Run(r"# effective configuration \(file: /etc/nvshim/config\.toml\)"),
    ("docs/commands.md", "nvshim install --prefix /usr/local/nvshim --bin-dir /usr/bin "
                         "--hooks-dir /usr/share/containers/oci/hooks.d"):
        Run(r"installed /usr/share/containers/oci/hooks\.d/oci-nvshim-hook\.json",
            step=Step(after="readlink /usr/bin/nvshim-hook")),
    ("docs/commands.md", "nvshim system create-device-nodes --control-devices --dry-run"):
        Run(r"/dev/nvidia-uvm-tools: present \(508:1\)"),
    ("docs/commands.md", "nvshim node show --engine containerd --host-root /host"):
        Run(r'"config": "/host/etc/containerd/config\.toml"'),
    ("docs/commands.md", "nvshim configure --engine containerd --enable-cdi --restart signal "
                         "--socket /run/containerd/containerd.sock"):
        Run(r"sent SIGHUP to containerd \(pid \d+\), the owner of /run/containerd/containerd\.sock",
            step=Step(before=CONTAINERD, after=CONTAINERD_GONE), absent="still running"),
    ("docs/commands.md", "nvshim configure --engine docker --set-as-default --dry-run"):
        Run(r'\+    "default-runtime": "nvshim"\n(.*\n)*dry run: nothing written',
            step=Step(after="test ! -e /etc/docker/daemon.json && echo 'nothing written'")),
    ("docs/commands.md", "nvshim configure --engine crio"):
        Run(r"/etc/crio/crio\.conf\.d/99-nvshim\.toml: runtime 'nvshim' -> /usr/bin/nvshim-runtim"),
    ("docs/commands.md", "nvshim unconfigure --engine containerd"):
        Run(r"/etc/containerd/config\.toml", step=Step(
            after="test ! -e /etc/containerd/config.toml && echo 'original bytes: no file'")),
    ("docs/commands.md", "kubectl apply -f packaging/kubernetes/base/runtimeclass.yaml"):
        Run(r"runtimeclass\.node\.k8s\.io/nvshim (created|unchanged)", group="kube"),
    ("docs/commands.md", "nvshim mps start && nvshim mps status --json"):
        Run(r'"running": true'),
    ("docs/commands.md", "nvshim cdi generate --sharing -o /var/run/cdi/nvidia-shared.yaml"):
        Run(r"wrote /var/run/cdi/nvidia-shared\.yaml: \d+ devices, cdiVersion 0\.6\.0"),
    ("docs/commands.md", "nvshim doctor"):
        Run(r"OK +driver +driver 550\.90\.12, 8 GPU\(s\)(.*\n)*FAIL +engine-loaded", code=1),
    ("docs/commands.md", "nvshim doctor --json --engine containerd --only engine-loaded "
                         "--only cdi-spec"):
        Run(r'"healthy": false,\n(.*\n)* +"name": "cdi-spec",\n +"status": "ok"', code=1),
    ("docs/commands.md", "nvshim exporter --listen 127.0.0.1:9400 &"):
        Run(r"^nvshim_doctor_healthy 0\.0", code=0, step=Step(after=EXPORTER, daemon=True)),
    ("docs/commands.md", f"nvshim-runtime --root /run/runc create --bundle {BUNDLE_DIR} "
                         "my-container"):
        Run(r'"status": "created",(.*\n)*.*"nvshim\.io/injected": "GPU-92e91e7d', step=Step(
            after="runc --root /run/runc state my-container; "
                  "runc --root /run/runc delete -f my-container")),
    ("docs/commands.md", "nvshim-runtimed --verbose --workers 2"):
        Run(r"^(?!.*Traceback)", step=Step(after=RUNTIMED + "; ls /run/nvshim/runtime.sock",
                                           daemon=True)),
    ("docs/commands.md", "nvshim-runtimed --version"): Run(r"^nvshim-runtimed version \d"),
    ("docs/dra.md", "kubectl apply -k packaging/kubernetes/dra"):
        Run(r"daemonset\.apps/nvshim-dra created\n(.*\n)*deviceclass\.resource\.k8s\.io/"
            r"gpu\.nvshim\.io created", group="kube"),
    ("docs/dra.md", "kubectl get resourceslices -o wide"):
        Run(r"No resources found", group="kube"),
    ("docs/dra.md", "kubectl get deviceclasses"): Run(r"gpu\.nvshim\.io", group="kube"),
    ("docs/dra.md", "kubectl -n nvshim-dra set env daemonset/nvshim-dra "
                    "NVIDIA_DRIVER_ROOT=/run/nvidia/driver"):
        Run(r"daemonset\.apps/nvshim-dra env updated", group="kube"),
    ("docs/install.md", "/tmp/nvshim-bundle/bin/nvshim install --prefix /usr/local/nvshim "
                        "--bin-dir /usr/bin --hooks-dir /usr/share/containers/oci/hooks.d"):
        Run(r"installed /usr/bin/nvshim-runtime", step=Step(
            before='cp -a "$HOST_BUNDLE" /tmp/nvshim-bundle',
            after="head -1 /usr/local/nvshim/bin/nvshim; /usr/bin/nvshim --version")),
    ("docs/install.md", "python3 -m pip wheel --no-deps -w dist ."):
        Run(r"^nvshim-0\.1\.0-py3-none-any\.whl$", group="pip", step=Step(after="ls dist")),
    ("docs/install.md", "python3 -m venv /opt/nvshim && /opt/nvshim/bin/pip install "
                        "dist/nvshim-0.1.0-py3-none-any.whl"):
        Run(r"Successfully installed .*nvshim-0\.1\.0", group="pip"),
    ("docs/install.md", "/opt/nvshim/bin/nvshim install --bin-dir /usr/bin "
                        "--hooks-dir /usr/share/containers/oci/hooks.d"):
        Run(r"installed /usr/bin/nvshim-hook(.*\n)*^/opt/nvshim/lib/python3\.\d+/site-packages$",
            group="pip", step=Step(after="grep -o '/opt/nvshim/lib/python3[.0-9]*/site-packages' "
                                         "/usr/bin/nvshim-hook | head -1")),
    ("docs/install.md", "/opt/nvshim/bin/python3 -I -m nvshim.runtime.frontbin build"):
        Run(r"^/opt/nvshim/lib/python3\.\d+/site-packages/nvshim/runtime/_front/"
            r"front-[0-9a-f]{16}-\w+$", group="pip"),
    ("docs/install.md", "nvshim --version && nvshim info"):
        Run(r"^nvshim version \d.*\n(.*\n)*Driver 550\.90\.12"),
    ("docs/install.md", "nvshim configure --engine containerd --enable-cdi"):
        Run(r"/etc/containerd/config\.toml: .*runtime 'nvshim' -> /usr/bin/nvshim-runtime"),
    ("docs/install.md", "nvshim cdi refresh"): Run(r"/var/run/cdi/nvidia\.yaml .*33 devices"),
    ("docs/install.md", "nvshim cdi refresh --force"):
        Run(r"nvshim: refreshed /var/run/cdi/nvidia\.yaml"),
    ("docs/kubernetes.md", "kubectl apply -k packaging/kubernetes/overlays/containerd"):
        Run(r"daemonset\.apps/nvshim-node created", group="kube"),
    ("docs/kubernetes.md", "kubectl apply -f packaging/kubernetes/examples/gpu-smoke.yaml"):
        Run(r"pod/gpu-smoke created", group="kube", step=Step(
            before="kubectl create serviceaccount default")),  # the controller-manager's
    ("docs/kubernetes.md", "kubectl apply -k packaging/kubernetes/overlays/aks"):
        Run(r"daemonset\.apps/nvshim-node configured", group="kube"),
    ("docs/kubernetes.md", "kubectl apply -k packaging/kubernetes/overlays/crio"):
        Run(r"daemonset\.apps/nvshim-node configured", group="kube"),
    ("docs/kubernetes.md", "kubectl apply -k packaging/kubernetes/overlays/openshift"):
        Run(r"rolebinding\.rbac\.authorization\.k8s\.io/\S+ created", group="kube"),
    ("docs/nic-pairing.md", "nvshim info --topology"):
        Run(r"NIC0: mlx5_0 +0000:15:00\.0 +NUMA 0 +InfiniBand", group="rdma"),
    ("docs/node-health.md", "nvshim doctor"): Run(r"OK +cdi-spec +\d spec\(s\)", code=1),
    ("docs/real-gpu.md", "bash tests/setup.sh"):
        Run(r"nvshim ready", step=Step(after=".venv/bin/python3 -c 'import nvshim' && "
                                             "echo nvshim ready")),
}  # fmt: skip

# (page, command prefix) -> (the test that reads it from the page and runs it, a piece of
# that command the test's source names)
ELSEWHERE = {
    ("README.md", "bash tests/demo.sh"): ("tests/test_demo.py", "tests/demo.sh"),
    ("README.md", "bash tests/run.sh"): (".ci/run", "bash tests/run.sh"),
    ("docs/cdi-hook.md", "nvshim-hook "): ("tests/test_docs_cdi_hook.py", "hook_lines"),
    ("docs/commands.md", "nvshim-hook "): ("tests/test_docs_cdi_hook.py", "hook_lines"),
    ("docs/coming-from-nvidia-toolkit.md", "nvshim "): ("tests/test_readme_nct.py", "steps("),
    ("docs/development.md", "python3 .ci/imports.py"):
        ("tests/test_imports.py", "python3 .ci/imports.py"),
    ("docs/dra.md", "kubectl -n nvshim delete"): ("tests/test_dra.py", "kubectl -n nvshim delete"),
    ("docs/install.md", ".venv/bin/python3 packaging/bundle/build.py"):
        ("tests/debroot.py", 'documented("docs/install.md", ".venv/bin/python3 packaging/bundle'),
    ("docs/install.md", "ln -s packaging/debian debian"):
        ("tests/test_debian_package.py", 'documented("docs/install.md", p) for p in ("ln -s "'),
    ("docs/install.md", "dpkg-buildpackage"):
        ("tests/test_debian_package.py", '"dpkg-buildpackage"))'),
    ("docs/install.md", "lintian"):
        ("tests/test_debian_package.py", 'documented("docs/install.md", "lintian ")'),
    # as written where mmdebstrap is missing (its one-line error); the image itself is built
    # from a prebuilt Debian root with --base-tar by tests/node_image.py
    ("docs/kubernetes.md", "python3 packaging/container/build.py"):
        ("tests/test_node_image.py", 'documented("docs/kubernetes.md", "python3 packaging/'),
    ("docs/real-gpu.md", ".venv/bin/python3 bench/real_gpu_carry.py"):
        ("tests/test_real_gpu_kit.py", 'documented("docs/real-gpu.md", ".venv/bin/python3 bench/'),
    ("docs/install.md", "/tmp/nvshim-bundle/bin/nvshim install --root"):
        ("tests/test_bundle.py", "nvshim install --root"),
}  # fmt: skip
# Run by a test too, but its own way, not read from the page: the steps that need nodes
# running the DaemonSet run on tests/test_k8s_node_e2e.py's real kubelet (containerd and
# CRI-O), in its namespaces; the package is installed with dpkg -i (the page's other way)
# into a scratch Debian root; the real-GPU kit runs on a simulated host, where its CUDA
# checks skip. Kept apart so that it is plain which ones they are.
SAME_PROGRAM = {
    ("docs/install.md", "apt install ./nvshim_0.1.0-1_amd64.deb"):
        ("tests/test_debian_package.py", 'node.run("dpkg -i /ctr/nvshim.deb")'),
    ("docs/real-gpu.md", "sudo sh bench/real_gpu.sh"):
        ("tests/test_real_gpu_kit.py", '"bench", "real_gpu.sh"), "--out"'),
    ("docs/kubernetes.md", "kubectl -n nvshim rollout status daemonset/nvshim-node"):
        ("tests/test_k8s_node_e2e.py", '"rollout", "status", "daemonset/nvshim-node"'),
    ("docs/kubernetes.md", "kubectl logs gpu-smoke"):
        ("tests/test_k8s_node_e2e.py", 'node.logs("gpu-smoke")'),
    ("docs/kubernetes.md", "kubectl -n nvshim logs daemonset/nvshim-node -c nvshim-node"):
        ("tests/test_k8s_node_e2e.py", '"daemonset/nvshim-node", "-c", "nvshim-node"'),
}  # fmt: skip

# what the commands write on a real machine
WRITTEN = ("/usr/local/nvshim", "/usr/bin/nvshim-runtimed", "/etc/nvshim/config.toml",
           "/etc/crio/crio.conf.d/99-nvshim.toml", "/var/run/cdi/nvidia-shared.yaml",
           "/tmp/nvshim-bundle", "/run/runc/my-container")  # fmt: skip
COMMANDS = all_commands()
RUNS = [c for c in COMMANDS if (c.page, c.text) in RUN]


def elsewhere(command, registry=ELSEWHERE) -> tuple[str, str] | None:
    return next(
        (test for (page, prefix), test in registry.items()
         if page == command.page and command.text.startswith(prefix)),
        None,
    )  # fmt: skip


def test_every_command_is_in_exactly_one_class():
    wrong = []
    for command in COMMANDS:
        classes = [
            (command.page, command.text) in RUN,
            elsewhere(command) is not None,
            elsewhere(command, SAME_PROGRAM) is not None,
            command.reason is not None,
        ]
        if classes.count(True) != 1:
            wrong.append(f"{command.id}: {command.text} ({classes.count(True)} classes)")
    assert wrong == []
    found = {(c.page, c.text) for c in COMMANDS}
    assert [key for key in RUN if key not in found] == []  # no entry outlives its command
    registries = {**ELSEWHERE, **SAME_PROGRAM}
    used = {(c.page, p) for c in COMMANDS for (pg, p) in registries if pg == c.page
            and c.text.startswith(p)}  # fmt: skip
    assert [key for key in registries if key not in used] == []


def test_every_page_with_a_shell_block_is_read():
    read = {c.page for c in COMMANDS}
    for path in pages():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if re.search(r"^\s*```(sh|bash|shell|console)$|^\$ ", text, re.M):
            assert os.path.relpath(path, REPO) in read, path
    assert {"README.md", "docs/commands.md", "docs/install.md", "docs/kubernetes.md"} <= read


@pytest.mark.parametrize("key", sorted(ELSEWHERE), ids=lambda k: f"{k[0]}:{k[1]}")
def test_the_test_named_elsewhere_reads_the_page_and_names_the_command(key):
    test, fragment = ELSEWHERE[key]
    with open(os.path.join(REPO, test), encoding="utf-8") as fh:
        source = fh.read()
    assert os.path.basename(key[0]) in source, f"{test} does not read {key[0]}"
    assert fragment in source


@pytest.mark.parametrize("key", sorted(SAME_PROGRAM), ids=lambda k: f"{k[0]}:{k[1]}")
def test_the_test_named_for_the_same_program_runs_it(key):
    test, fragment = SAME_PROGRAM[key]
    with open(os.path.join(REPO, test), encoding="utf-8") as fh:
        assert fragment in fh.read()


def test_each_synopsis_of_the_commands_table_has_an_example_run():
    run = [c.text for c in COMMANDS if c.reason is None]
    missing = [s for s in synopses() if not any(t.startswith(s) for t in run)]
    assert missing == []


# a placeholder word of a command line in prose: FILE, DIR, NAME, N, CC:BRAND
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_:]*")


def _resolve(cmd: click.Command, name: str, args: list[str]) -> list[str]:
    """Parse ``args`` as click would run them, through the group chain, invoking nothing;
    returns the hidden spellings used (nvidia-ctk's names: they work, but are not shown)."""
    hidden, words = [], list(args)
    ctx = cmd.make_context(name, list(args))
    while True:
        for param in cmd.params:
            hides = getattr(param, "hidden", False)
            unshown = [*getattr(param, "hidden_opts", ()), *(param.opts if hides else ())]
            hidden += [w for w in words if w.split("=")[0] in unshown]
        if not isinstance(cmd, click.Group):
            return hidden
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return hidden
        name, cmd, words = cmd.resolve_command(ctx, rest)
        hidden += [name] if cmd.hidden else []
        ctx = cmd.make_context(name, list(words), parent=ctx)


def parse_problem(argv: list[str]) -> str | None:
    """Why the command line ``argv`` of nvshim, nvshim-hook or nvshim-runtimed would not
    parse with the current CLI (None: it does). Prose may leave out an argument or an
    option's value, and may write a placeholder (``--engine-config FILE``) for a value."""
    from nvshim.runtimed.main import _command as runtimed

    program, args = argv[0], argv[1:]
    placeholders = [a for a in args if PLACEHOLDER.fullmatch(a)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # --help, --version
            if program == "nvshim-hook":
                parse_args(args)
            elif hidden := _resolve(cli if program == "nvshim" else runtimed(), program, args):
                return f"{', '.join(hidden)}: nvidia-ctk's name (works, not shown): use nvshim's"
    except (HelpRequested, click.exceptions.Exit, click.exceptions.NoArgsIsHelpError):
        return None
    except click.MissingParameter:
        return None
    except (click.UsageError, UsageError) as err:
        message = err.format_message() if isinstance(err, click.UsageError) else str(err)
        left_out = ("requires an argument", "missing argument")
        if any(words in message for words in left_out):
            return None
        if isinstance(err, click.BadParameter) and any(f"'{p}'" in message for p in placeholders):
            return None
        return message
    return None


# where a page shows nvidia-ctk's spelling as such (docs/commands.md "Conventions")
NVIDIA_CTK_NAMES = {
    ("docs/coming-from-nvidia-toolkit.md", "nvshim runtime configure"),
    ("docs/commands.md", "nvshim runtime configure"),
}


def test_every_command_line_in_the_pages_parses():
    """A command line in prose or in a block (``nvshim doctor --only NAME``) names options
    and commands the CLI has now, in nvshim's spelling: a renamed or removed one, or
    nvidia-ctk's name outside the pages that show it as such, fails here, page:line named."""
    lines = all_program_lines()
    stale = [
        f"{c.id}: {c.text}: {why}"
        for c, argv in lines
        if (c.page, c.text) not in NVIDIA_CTK_NAMES and (why := parse_problem(argv))
    ]
    assert stale == []
    assert len(lines) > 100  # the pages were read


def _option_names(cmd: click.Command, hidden: bool) -> set[str]:
    """The option names of ``cmd`` and every command below it: the shown ones, or (with
    ``hidden``) the spellings that work unshown."""
    names: set[str] = set()
    for param in cmd.params:
        if isinstance(param, click.Option):
            spellings = {*param.opts, *param.secondary_opts}
            unshown = set(getattr(param, "hidden_opts", ())) | (
                spellings if param.hidden else set()
            )
            names |= unshown if hidden else spellings - unshown
    for sub in cmd.commands.values() if isinstance(cmd, click.Group) else ():
        names |= _option_names(sub, hidden)
    return names


def synopsis_problem(text: str) -> str | None:
    """Why the synopsis ``text`` (``nvshim cdi list [--json] [--cdi-dir DIR]...``) names an
    option its command (or, for ``a|b``, its commands) does not show (None: it does not)."""
    from nvshim.runtimed.main import _command as runtimed

    words = text.replace("\\|", "|").split()
    program = INLINE.match(words[0]).group(1)
    named = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w.-]*)", " ".join(words[1:])))
    if program == "nvshim-hook":
        shown = {"--config", "--log-format", "-h", "--help", "--version", *IGNORED_FLAGS}
        shown |= {*STATE_OPTION, *(o for _, options, _ in STEPS.values() for o in options)}
        shown |= {"--ldconfig-path"}
    else:
        cmd: click.Command = cli if program == "nvshim" else runtimed()
        shown = _option_names(cmd, hidden=False) if cmd is not cli else set()
        for word in words[1:]:
            sub = (
                cmd.get_command(click.Context(cmd), word) if isinstance(cmd, click.Group) else None
            )
            if sub is None:
                break
            shown |= {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
            cmd = sub
        shown |= _option_names(cmd, hidden=False) | {"-h", "--help", "--version"}
        shown |= {o for p in cli.params if isinstance(p, click.Option) for o in p.opts}
    unknown = sorted(named - shown)
    return f"{', '.join(unknown)}: not an option it shows" if unknown else None


def test_every_option_a_synopsis_names_is_one_its_command_shows():
    found = synopsis_lines()
    stale = [f"{c.id}: {c.text}: {why}" for c in found if (why := synopsis_problem(c.text))]
    assert stale == []
    assert len(found) > 20 and any(c.text.startswith("nvshim doctor [--json]") for c in found)


def test_a_stale_synopsis_is_found():
    assert synopsis_problem("nvshim cdi list [--json] [--cdi-dir DIR]...") is None
    assert synopsis_problem("nvshim mps start\\|stop\\|status [--gpu ID]... [--json]") is None
    assert synopsis_problem("nvshim cdi list [--spec-dir DIR]...") == (
        "--spec-dir: not an option it shows"
    )
    assert synopsis_problem("nvshim doctor [--check NAME]...") == "--check: not an option it shows"
    assert synopsis_problem("nvshim-runtimed [--workers N] [--verbose]") is None
    assert synopsis_problem("nvshim-runtimed [--worker N]") == "--worker: not an option it shows"
    assert synopsis_problem("nvshim-hook update-ldcache [--folder DIR]...") is None
    assert synopsis_problem("nvshim-hook [--foldr DIR] ...") == "--foldr: not an option it shows"


def test_a_stale_command_line_is_found(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "Run `nvshim doctor --check engine-loaded` or `nvshim doctor --json`, then\n"
        "`sudo nvshim configure --engine dockr` and `.venv/bin/nvshim-hook prestat`;\n"
        "`nvshim configure --engine E --engine-config FILE` is fine, `nvshim mps start\n"
        "--gpu 0 && nvshim mps status --jsn` is not. `nvshim cdi lst`, `nvshim-runtimed\n"
        "--worker 2`, `nvshim-hook prestart < state.json`, `nvshim exporter 2>/dev/null &`.\n"
        "`X=1 chroot /host /opt/nvshim/bin/nvshim info --jsn`.\n"
        "Skipped: `nvshim cdi validate FILE...`, `nvshim <cmd>`, `nvshim`, `nvshim-runtime x`.\n"
        "```sh\nnvshim --bogus\n```\n"
    )
    found = {(c.line, c.text): parse_problem(argv) for c, argv in inline_commands(str(page))}
    assert list(found) == [
        (1, "nvshim doctor --check engine-loaded"), (1, "nvshim doctor --json"),
        (2, "sudo nvshim configure --engine dockr"), (2, ".venv/bin/nvshim-hook prestat"),
        (3, "nvshim configure --engine E --engine-config FILE"), (3, "nvshim mps start --gpu 0"),
        (3, "nvshim mps status --jsn"), (4, "nvshim cdi lst"), (4, "nvshim-runtimed --worker 2"),
        (5, "nvshim-hook prestart < state.json"), (5, "nvshim exporter 2 > /dev/null"),
        (6, "X=1 chroot /host /opt/nvshim/bin/nvshim info --jsn"),
    ]  # fmt: skip
    assert [line for line, why in found.items() if why is None] == [
        (1, "nvshim doctor --json"),
        (3, "nvshim configure --engine E --engine-config FILE"),
        (3, "nvshim mps start --gpu 0"),
        (5, "nvshim-hook prestart < state.json"),
        (5, "nvshim exporter 2 > /dev/null"),
    ]
    assert "--check: nvidia-ctk's name" in found[1, "nvshim doctor --check engine-loaded"]
    assert "'dockr' is not one of" in found[2, "sudo nvshim configure --engine dockr"]
    assert "no such step 'prestat'" in found[2, ".venv/bin/nvshim-hook prestat"]
    assert "No such option '--jsn'" in found[3, "nvshim mps status --jsn"]
    assert "No such command 'lst'" in found[4, "nvshim cdi lst"]
    assert (
        "No such option '--jsn'" in found[6, "X=1 chroot /host /opt/nvshim/bin/nvshim info --jsn"]
    )


def test_reading_a_page(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "```sh\nnvshim info   # a comment\n# shown output\nnvshim a \\\n    --b 'x # y'\n```\n"
        "<!-- not run by tests: `systemctl`: needs the host's systemd -->\n"
        "```sh\nsystemctl status x\nnvshim doctor\n```\n"
        "<!-- not run by tests: needs a real GPU -->\n```bash\nnvidia-smi\n```\n"
        "```\n$ nvshim info --topology\nGPU0 X\n```\n```yaml\nkind: Pod\n```\n"
    )
    got = [(c.line, c.text, c.reason) for c in page_commands(str(page), str(tmp_path))]
    assert got == [
        (2, "nvshim info", None),
        (4, "nvshim a --b 'x # y'", None),
        (9, "systemctl status x", "needs the host's systemd"),
        (10, "nvshim doctor", None),
        (14, "nvidia-smi", "needs a real GPU"),
        (17, "nvshim info --topology", None),
    ]


# -- running them ------------------------------------------------------------------------


# group -> the simulated host its /etc/nvshim/config.toml names, in a network namespace of
# its own; None: no host, the network of the rest of the suite (an API server on this
# machine; the package index pip reaches, as for the bundle build of tests/debroot.py)
GROUPS = {"mig": "h100x8-mig", "rdma": "hgx-h100x8-rdma", "kube": None, "pip": None}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """{command id: (exit code, output)} of every RUN command, each group in one sandbox
    (the groups at once: most of their time is waiting)."""
    from concurrent.futures import ThreadPoolExecutor

    work = tmp_path_factory.mktemp("docs-commands")
    results = {"host before": {p: os.path.lexists(p) for p in WRITTEN}}
    with ThreadPoolExecutor(len(GROUPS)) as pool:
        for done in pool.map(lambda group: run_group(work / group, group), GROUPS):
            results.update(done)
    return results


def run_group(base, group: str) -> dict[str, tuple[int, str]]:
    """{command id: (exit code, output)} of the RUN commands of ``group``, in page order."""
    from tests.sim import fake_mps_control
    from tests.sim.simhost import build_host

    host = GROUPS[group]
    commands = [c for c in RUNS if RUN[(c.page, c.text)].group == group]
    env, server = {}, None
    config = base / "config.toml"
    base.mkdir()
    config.write_text("")
    setup = Step()
    if host:
        sim = build_host(host, str(base / "host"), extra_files=fake_mps_control.extra_files())
        config.write_text(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
            '[sharing]\nconfig = "/etc/nvshim/sharing.yaml"\n'
        )
        env["SIM"] = sim.driver_root
        # the sharing file the device plugin would be given (docs/sharing.md)
        corpus = os.path.join(REPO, "tests", "sharing_corpus", "mps-mixed.yaml")
        setup = Step(before=f"cp {corpus} /etc/nvshim/sharing.yaml")
    if group == "mig":
        env.update(bundles(base))
    if group == "kube":
        server = api_server(base)
        env["KUBECONFIG"] = str(server.kubeconfig)
        env["PATH"] = f"{kube_bin()}:{os.environ['PATH']}"
    steps = [(c.text.replace(BUNDLE_DIR, "$BUNDLE"), RUN[(c.page, c.text)].step)
             for c in commands]  # fmt: skip
    try:
        outcome = run_sandbox(
            str(base), str(config), [(":", setup), *steps], env, teardown(group),
            net=host is not None,
        )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    return {c.id: result for c, result in zip(commands, outcome[1:], strict=True)}


def teardown(group: str) -> str:
    """What the sandbox stops before it goes: MPS daemons, background jobs."""
    if GROUPS[group] is None:
        return ":"
    return "nvshim mps stop >/dev/null 2>&1; kill $(jobs -p) 2>/dev/null; wait"


def bundles(base) -> dict[str, str]:
    """The OCI bundle for commands.md's ``/path/to/bundle`` (asking for GPU 0 through a CDI
    annotation) and the host bundle install.md's build line makes (tests/debroot.py)."""
    from tests.debroot import bundle_dir
    from tests.podman_util import make_busybox_rootfs
    from tests.runc_util import make_bundle

    rootfs = make_busybox_rootfs(base / "rootfs")
    oci = make_bundle(base, rootfs, ["true"], annotations={"cdi.k8s.io/docs": "nvidia.com/gpu=0"})
    return {"BUNDLE": oci, "HOST_BUNDLE": bundle_dir()}


def api_server(base):
    from tests.dra_api import ApiServer

    return ApiServer(base / "api")


def kube_bin() -> str:
    from tests.k8s.artifacts import k8s_bin

    return k8s_bin()


@needs_root
@pytest.mark.parametrize("command", RUNS, ids=lambda c: f"{c.id} {c.text[:60]}")
def test_run_as_written(command, ran):
    expect = RUN[(command.page, command.text)]
    code, output = ran[command.id]
    assert code == expect.code, output
    assert re.search(expect.pattern, output, re.M), output
    if expect.absent:
        assert expect.absent not in output, output
    assert "Traceback" not in output, output


@needs_root
def test_the_sandbox_left_the_host_alone(ran):
    """What the commands wrote stayed in the overlays (tests/hostguard.py checks /run/nvshim
    and /var/log; these are the rest)."""
    assert {p: os.path.lexists(p) for p in WRITTEN} == ran["host before"]
