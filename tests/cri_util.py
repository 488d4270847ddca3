"""Drive a private containerd through the CRI from tests (FACTS §9): no registry, no CNI.

- ``image_archive`` packs a rootfs directory into a docker-archive tar (one layer) that
  ``ctr images import`` accepts, under one or more names (the pod sandbox image included).
- ``cri_ready_config`` adapts an operator's containerd v2 config to a test host: the
  sandbox image is a local one, no negative ``oom_score_adj``, no host-global directories.
- ``CriClient`` wraps the generated ``cri_api`` gRPC stubs (PyPI
  ``container-runtime-interface-api`` and ``grpcio``) for host-network pods and one-shot
  containers; ``read_cri_log`` turns a CRI container log back into the lines written.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def _layer_tar(rootfs: str) -> bytes:
    """An uncompressed tar of ``rootfs`` (root-owned entries, fixed times, sorted)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in [*dirnames, *sorted(filenames)]:
                full = os.path.join(dirpath, name)
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isfile():
                    with open(full, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def image_archive(
    rootfs: str | os.PathLike,
    dest: str | os.PathLike,
    refs: Iterable[str],
    cmd: list[str] | None = None,
) -> str:
    """Write a docker-archive tar of ``rootfs`` named ``refs`` at ``dest``; return ``dest``.

    The image's command is ``cmd``, by default ``sleep`` for a long time (so it also serves
    as a pod sandbox image); containers give their own command.
    """
    dest = os.fspath(dest)
    layer = dest + ".layer"
    with open(layer, "wb") as fh:
        fh.write(_layer_tar(os.fspath(rootfs)))
    try:
        return layer_archive(layer, dest, refs, cmd=cmd or ["/bin/sleep", "86400"])
    finally:
        os.unlink(layer)


def layer_archive(
    layer: str | os.PathLike,
    dest: str | os.PathLike,
    refs: Iterable[str],
    entrypoint: list[str] | None = None,
    cmd: list[str] | None = None,
) -> str:
    """Write a docker-archive tar at ``dest`` whose one layer is the tar file ``layer``
    (a root filesystem tarball), named ``refs``, with ``entrypoint`` and ``cmd``."""
    digest = hashlib.sha256()
    with open(layer, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    layer_id = digest.hexdigest()
    image_config: dict = {"Env": [f"PATH={IMAGE_PATH}"]}
    if entrypoint:
        image_config["Entrypoint"] = list(entrypoint)
    if cmd:
        image_config["Cmd"] = list(cmd)
    config = {
        "architecture": _ARCH.get(platform.machine(), platform.machine()),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/cri_util.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [
        {"Config": config_name, "RepoTags": list(refs), "Layers": [f"{layer_id}/layer.tar"]}
    ]
    dest = os.fspath(dest)
    with tarfile.open(dest, "w") as tar:
        tar.add(os.fspath(layer), arcname=f"{layer_id}/layer.tar", recursive=False)
        for name, data in (
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def cri_ready_config(text: str, scratch: str | os.PathLike, sandbox_image: str) -> str:
    """A containerd v2 config (text) made runnable on a test host, everything else kept.

    Sets the CRI ``sandbox_image`` (a locally imported one: no registry is reachable) and
    ``restrict_oom_score_adj = true`` (a negative score is refused here), and moves the
    CNI and ``opt`` directories under ``scratch`` so no host-global directory is created.
    """
    import tomlkit

    doc = tomlkit.parse(text)
    if doc.get("version") != 2:
        raise ValueError("cri_ready_config takes a containerd config version 2")
    scratch = Path(scratch)
    plugins = doc["plugins"]
    cri = plugins["io.containerd.grpc.v1.cri"]
    cri["sandbox_image"] = sandbox_image
    cri["restrict_oom_score_adj"] = True
    cri["cni"]["bin_dir"] = str(scratch / "cni-bin")
    cri["cni"]["conf_dir"] = str(scratch / "cni-conf")
    if "io.containerd.internal.v1.opt" in plugins:
        plugins["io.containerd.internal.v1.opt"]["path"] = str(scratch / "opt")
    return tomlkit.dumps(doc)


def read_cri_log(path: str | os.PathLike) -> list[str]:
    """The lines a container wrote, from a CRI log (``<time> <stream> <P|F> <text>``)."""
    lines: list[str] = []
    partial = ""
    for raw in Path(path).read_text(errors="replace").splitlines():
        parts = raw.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        if parts[2] == "P":
            partial += text
            continue
        lines.append(partial + text)
        partial = ""
    return lines


@dataclass
class ContainerResult:
    """A finished container: its id, exit code, and the lines of its log."""

    container_id: str
    exit_code: int
    lines: list[str] = field(default_factory=list)


class CriClient:
    """A CRI client on an engine's CRI socket (containerd, CRI-O); remembers the pods it
    ran so ``cleanup`` stops and removes them (containers included)."""

    def __init__(self, socket_path: str, timeout: float = 60.0) -> None:
        import grpc
        from cri_api.v1 import api_pb2, api_pb2_grpc

        self.api = api_pb2
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)
        self.pods: list[str] = []

    def close(self) -> None:
        self.channel.close()

    def image_id(self, ref: str) -> str | None:
        """The id of image ``ref`` as the CRI plugin sees it (``None``: unknown)."""
        reply = self.images.ImageStatus(
            self.api.ImageStatusRequest(image=self.api.ImageSpec(image=ref)),
            timeout=self.timeout,
        )
        return reply.image.id or None

    def wait_image(self, ref: str, timeout: float = 20.0) -> str:
        """Wait until the CRI plugin knows image ``ref`` (it syncs imports by events)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.image_id(ref)
            if found:
                return found
            time.sleep(0.1)
        raise TimeoutError(f"the CRI plugin does not see image {ref}")

    def _pod_config(self, name: str, log_dir: str, annotations: dict[str, str]):
        api = self.api
        return api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="nvshim"),
            log_directory=log_dir,
            annotations=annotations,
            linux=api.LinuxPodSandboxConfig(
                security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(network=api.NamespaceMode.NODE)
                )
            ),
        )

    def run_pod(
        self,
        name: str,
        log_dir: str | os.PathLike,
        handler: str,
        annotations: dict[str, str] | None = None,
    ) -> tuple[str, object]:
        """RunPodSandbox (host network) on ``handler``; return (pod id, its config)."""
        config = self._pod_config(name, os.fspath(log_dir), dict(annotations or {}))
        reply = self.runtime.RunPodSandbox(
            self.api.RunPodSandboxRequest(config=config, runtime_handler=handler),
            timeout=self.timeout,
        )
        self.pods.append(reply.pod_sandbox_id)
        return reply.pod_sandbox_id, config

    def run_container(
        self,
        pod: tuple[str, object],
        name: str,
        image: str,
        command: list[str],
        env: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        timeout: float = 30.0,
        poll: float = 0.05,
        read_only: bool = False,
    ) -> ContainerResult:
        """Create, start and wait for a container in ``pod`` (its state read every ``poll``
        seconds; ``read_only``: ``readOnlyRootFilesystem``); return its result and log."""
        api = self.api
        pod_id, pod_config = pod
        log_name = f"{name}.log"
        config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name=name),
            image=api.ImageSpec(image=image),
            command=command,
            envs=[api.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            annotations=dict(annotations or {}),
            log_path=log_name,
        )
        if read_only:
            config.linux.security_context.readonly_rootfs = True
        created = self.runtime.CreateContainer(
            api.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config
            ),
            timeout=self.timeout,
        )
        cid = created.container_id
        self.runtime.StartContainer(
            api.StartContainerRequest(container_id=cid), timeout=self.timeout
        )
        deadline = time.monotonic() + timeout
        while True:
            status = self.runtime.ContainerStatus(
                api.ContainerStatusRequest(container_id=cid), timeout=self.timeout
            ).status
            if status.state == api.ContainerState.CONTAINER_EXITED:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {name} ({cid}) did not exit")
            time.sleep(poll)
        log_path = os.path.join(pod_config.log_directory, log_name)
        lines = read_cri_log(log_path) if os.path.exists(log_path) else []
        return ContainerResult(cid, status.exit_code, lines)

    def cleanup(self) -> list[str]:
        """Stop and remove every pod this client ran; return the errors (empty: all gone)."""
        errors = []
        for pod_id in reversed(self.pods):
            for call, request in (
                (self.runtime.StopPodSandbox, self.api.StopPodSandboxRequest),
                (self.runtime.RemovePodSandbox, self.api.RemovePodSandboxRequest),
            ):
                try:
                    call(request(pod_sandbox_id=pod_id), timeout=self.timeout)
                except Exception as err:  # noqa: BLE001 - report, keep cleaning
                    errors.append(f"{pod_id[:12]}: {err}")
        self.pods.clear()
        return errors


@contextlib.contextmanager
def cri_session(socket_path: str, image: str):
    """A ``CriClient`` on ``socket_path`` once ``image`` is there. On the way out every pod
    it ran is removed and it is closed; a pod left behind fails the caller (after any
    error of its own, which goes first)."""
    cri = CriClient(socket_path)
    try:
        cri.wait_image(image)
        yield cri
    finally:
        errors = cri.cleanup()
        cri.close()
    if errors:
        raise AssertionError(f"CRI cleanup left: {errors}")


def processes_in_mount_ns(ns: str) -> list[int]:
    """PIDs whose mount namespace is ``ns`` (as ``readlink /proc/<pid>/ns/mnt`` shows it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def mounts_under(path: str | os.PathLike) -> list[str]:
    """Mount points (in this process's namespace) at or below ``path``."""
    base = os.path.realpath(os.fspath(path))
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == base or point.startswith(base + "/"):
                found.append(point)
    return found


def configure_containerd(config: str | os.PathLike, runtime_path: str, *extra: str) -> None:
    """``nvshim configure --runtime containerd`` of ``config`` (a 1.6 file) for
    ``runtime_path``, with ``extra`` options; asserts it succeeded."""
    from tests.conftest import run_nvshim

    proc = run_nvshim(
        "configure",
        "--engine",
        "containerd",
        "--engine-config",
        os.fspath(config),
        "--runtime-path",
        runtime_path,
        *extra,
        env={"NVSHIM_CONTAINERD_VERSION": "1.6.20"},
    )
    assert proc.returncode == 0, proc.stderr


def nvshim_containerd(
    tmp_path: Path, rootfs: str, image: str, runtime_path: str
) -> tuple[Path, str, Path]:
    """For a private containerd 1.6 running ``image`` (made of ``rootfs``) on an
    ``nvshim`` handler whose binary is ``runtime_path``: (its config, the image archive
    to import, with the sandbox image under ``<image>-pause``, a pod log directory)."""
    from tests.engines.corpus_cases import CORPUS

    pause = f"{image}-pause"
    archive = image_archive(rootfs, tmp_path / "image.tar", [image, pause])
    config = tmp_path / "containerd.toml"
    v16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
    config.write_text(cri_ready_config(v16, tmp_path / "scratch", pause))
    configure_containerd(config, runtime_path)
    logs = tmp_path / "pod-logs"
    logs.mkdir()
    return config, archive, logs
