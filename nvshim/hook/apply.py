"""The standalone prestart hook's application of container edits.

Host-side preparation happens first, in the host's mount namespace: each mount source
is cloned into a detached mount (``open_tree``) and device numbers are read from the
host nodes. Then, inside the container's mount namespace, mount points are made fd-based
in the root and the clones attached, and device nodes are created with ``mknodat``.
"""

from __future__ import annotations

import os
import stat

from nvshim.edits import ContainerEdits, DeviceNode, Mount
from nvshim.errors import NvshimError
from nvshim.hook.cgroup import allow_rule
from nvshim.record import record
from nvshim.rootfs import bind
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize


@record
class PlannedMount:
    """A host source already cloned (``tree_fd``) and where it goes in the container."""

    tree_fd: int
    container_path: str
    directory: bool
    attrs: int


@record(frozen=True)
class PlannedNode:
    """A device node to create in the container."""

    path: str
    kind: str
    major: int
    minor: int
    mode: int
    uid: int
    gid: int
    access: str

    @property
    def rule(self) -> str:
        return allow_rule(self.kind, self.major, self.minor, self.access)


def plan_mounts(mounts: list[Mount], attrs=bind.attrs_for) -> list[PlannedMount]:
    """Clone every bind source (host namespace); NvshimError before anything changed.
    ``attrs(options)``: the mount attributes each gets (the hook's own reading of the
    options by default; nvshim-runtime passes runc's, ``bind.runc_attrs``)."""
    planned: list[PlannedMount] = []
    try:
        for m in mounts:
            if m.type not in (None, "", "bind", "rbind"):
                raise NvshimError(f"mount {m.container_path}: type {m.type!r} is not supported")
            try:
                path = normalize(m.container_path)
            except RootPathError as err:
                raise NvshimError(f"mount {m.container_path!r}: {err}") from None
            tree = bind.clone_tree(m.host_path)
            directory = stat.S_ISDIR(os.fstat(tree).st_mode)  # of what was cloned
            planned.append(PlannedMount(tree, path, directory, attrs(m.options)))
    except BaseException:
        close_mounts(planned)
        raise
    return planned


def close_mounts(planned: list[PlannedMount]) -> None:
    for p in planned:
        os.close(p.tree_fd)


def plan_nodes(nodes: list[DeviceNode]) -> list[PlannedNode]:
    """Device nodes with numbers filled in from the host node when the edit lacks them."""
    planned = []
    for node in nodes:
        try:
            path = normalize(node.path)
        except RootPathError as err:
            raise NvshimError(f"device {node.path!r}: {err}") from None
        kind, major, minor = node.type or "c", node.major, node.minor
        if major is None or minor is None:
            try:
                st = os.stat(node.source)
            except OSError as err:
                raise NvshimError(f"{node.source}: cannot stat device: {err.strerror}") from None
            if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
                raise NvshimError(f"{node.source}: not a device node")
            kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        mode = node.file_mode if node.file_mode is not None else 0o666
        planned.append(
            PlannedNode(
                path,
                kind,
                major,
                minor,
                mode,
                node.uid or 0,
                node.gid or 0,
                node.permissions or "rwm",
            )
        )
        planned[-1].rule  # noqa: B018 - validates type and permissions now
    return planned


def attach_mounts(root: RootFS, planned: list[PlannedMount]) -> int:
    """Attach each clone at its container path (created fd-based when missing), in
    order: one below a directory bound earlier lands in that directory, as with runc."""
    opened: dict[str, int] = {}  # the mount points' directories, each opened once
    try:
        for p in planned:
            try:
                target = root.mountpoint(p.container_path, p.directory, opened)
            except (OSError, RootPathError) as err:
                reason = err.strerror if isinstance(err, OSError) else str(err)
                where = f"mount point {p.container_path} in the container"
                raise NvshimError(f"{where}: {reason}") from None
            try:
                bind.attach(p.tree_fd, target, p.attrs, p.container_path)
            finally:
                os.close(target)
            if p.directory:  # it may hide a directory kept open: look them up again
                root.close_opened(opened)
    finally:
        root.close_opened(opened)
    return len(planned)


def make_nodes(root: RootFS, planned: list[PlannedNode]) -> int:
    """Create each device node in the container root."""
    for n in planned:
        try:
            root.mknod(n.path, n.kind, n.major, n.minor, n.mode, n.uid, n.gid)
        except (OSError, RootPathError, ValueError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise NvshimError(f"device {n.path} in the container: {reason}") from None
    return len(planned)


def not_applied(edits: ContainerEdits) -> dict[str, str]:
    """Log fields for edits a prestart hook cannot apply, because the runtime already
    read them from config.json: env entries (names only) and additional GIDs."""
    fields = {}
    if edits.env:
        fields["env_not_applied"] = ",".join(e.split("=", 1)[0] for e in edits.env)
    if edits.additional_gids:
        fields["gids_not_applied"] = ",".join(str(g) for g in edits.additional_gids)
    return fields
