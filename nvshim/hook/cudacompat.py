"""``enable-cuda-compat``: CUDA forward compatibility, NVIDIA's rule read from its
``cmd/nvidia-cdi-hook/cudacompat``.

An image may carry a newer user-mode driver in ``/usr/local/cuda/compat`` (exactly one
regular file ``libcuda.so.X.Y[.Z]``) so a newer CUDA runs on an older data-center
driver. It is used when, with the file's ``.note.cuda.fwd_compatibility`` ELF note
(JSON: ``CUDA Version``, the ``Driver`` majors it runs on), the host driver's major is
listed and the compat version is newer than the host driver's (without a host driver
version: the note's CUDA version newer than the host's CUDA); without the note, when
no host CUDA version is given, the compat major must be above the host driver's.

Then its folder (as resolved inside the root) is written to
``/etc/ld.so.conf.d/00-compat-nvshim.conf``, which ``update-ldcache`` puts ahead of the
driver's folders, so ``libcuda.so.1`` resolves to the compat library. Everything is
read fd-based inside the root; nothing in it is executed.
"""

from __future__ import annotations

import os
import stat
import struct

from nvshim import fastjson
from nvshim.errors import NvshimError
from nvshim.record import record
from nvshim.rootfs import kernel
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize

DEFAULT_FOLDER = "/usr/local/cuda/compat"
CONF_FILE = "/etc/ld.so.conf.d/00-compat-nvshim.conf"
PREFIX = "libcuda.so."
NOTE_SECTION = b".note.cuda.fwd_compatibility"
NOTE_OWNER = "NVIDIA Corporation"
SHT_NOTE = 7
MAX_NOTE = 1 << 16
MAX_SECTIONS = 1 << 16

Version = tuple[int, int, int, tuple[str, ...]]


def parse_version(text: str | None) -> Version | None:
    """A loose semantic version (``v``, 1 to 3 numbers, ``-pre``, ``+meta``) as NVIDIA's
    hook parses it (Masterminds semver ``NewVersion``); None when unparsable."""
    if not text:
        return None
    text = text[1:] if text[0] in "vV" else text
    text = text.split("+", 1)[0]
    core, _, pre = text.partition("-")
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    if "-" in text and not pre:
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2], tuple(pre.split(".")) if pre else ()


def _key(v: Version) -> tuple:
    # a pre-release sorts before its release
    return (v[0], v[1], v[2], 0 if v[3] else 1, v[3])


def newer(a: Version, b: Version) -> bool:
    """True when version ``a`` is greater than ``b``."""
    return _key(a) > _key(b)


@record(frozen=True)
class CompatNote:
    """The JSON of a compat library's ``.note.cuda.fwd_compatibility`` note."""

    cuda_version: str
    drivers: tuple[int, ...]


def _align_up(size: int, to: int) -> int:
    # NVIDIA's alignUp on uint32 (an alignment of 0 gives 0)
    mask = 0xFFFFFFFF
    return ((size + to - 1) & mask) & ~((to - 1) & mask) & mask


def _trim(data: bytes, start: int, n: int) -> bytes:
    if not data:
        return b""
    start = min(len(data) - 1, start)
    return data[start : min(len(data), start + n)].strip(b"\0")


def read_note(fd: int) -> CompatNote | None:
    """The compat note of the ELF file ``fd`` (64- or 32-bit), None when it has none or
    it is not one NVIDIA's hook reads."""
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    end = "<" if head[5] == 1 else ">"
    wide = head[4] == 2
    if wide:
        (shoff,) = struct.unpack_from(end + "Q", head, 40)
        entsize, count, names = struct.unpack_from(end + "HHH", head, 58)
        layout, need = end + "IIQQQQIIQQ", 64
    else:
        (shoff,) = struct.unpack_from(end + "I", head, 32)
        entsize, count, names = struct.unpack_from(end + "HHH", head, 46)
        layout, need = end + "IIIIIIIIII", 40
    if entsize < need or not 0 < count < MAX_SECTIONS or names >= count:
        return None
    table = os.pread(fd, entsize * count, shoff)
    if len(table) < entsize * count:
        return None
    sections = [struct.unpack_from(layout, table, i * entsize) for i in range(count)]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    strtab = sections[names]
    strings = os.pread(fd, min(strtab[5], 1 << 20), strtab[4])
    for name, kind, _f, _a, offset, size, _l, _i, align, _e in sections:
        label = strings[name : strings.find(b"\0", name)] if name < len(strings) else b""
        if kind != SHT_NOTE or label != NOTE_SECTION:
            continue
        data = os.pread(fd, min(size, MAX_NOTE), offset)
        if len(data) < 12:
            return None
        namesz, descsz, _type = struct.unpack_from(end + "III", data, 0)
        if namesz == 0 or descsz == 0:
            return None
        owner = _trim(data, 12, _align_up(namesz, align))
        if owner != NOTE_OWNER.encode():
            return None
        desc = _trim(data, 12 + _align_up(namesz, align), descsz)
        return _parse_note(desc)
    return None


def _parse_note(desc: bytes) -> CompatNote | None:
    """The note's JSON (anything unusable: None, as NVIDIA's hook drops such a note)."""
    try:
        value = fastjson.loads(desc)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    fields = {str(k).lower(): v for k, v in value.items()}  # Go matches keys so
    cuda = fields.get("cuda version", "")
    drivers = fields.get("driver") or []
    if not isinstance(cuda, str) or not isinstance(drivers, list):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in drivers):
        return None
    return CompatNote(cuda, tuple(drivers))


def use_compat(
    compat_version: str, note: CompatNote | None, host_driver: str, host_cuda: str
) -> bool:
    """NVIDIA's decision: use the compat library of version ``compat_version`` (with its
    ``note``) given the host driver and CUDA versions (either may be empty)."""
    if not host_driver and not host_cuda:
        return False
    compat, driver, cuda = (parse_version(v) for v in (compat_version, host_driver, host_cuda))
    if note is not None:
        if compat is None or driver is None:
            wanted = parse_version(note.cuda_version)
            return cuda is not None and wanted is not None and newer(wanted, cuda)
        return driver[0] in note.drivers and newer(compat, driver)
    if host_cuda or driver is None or compat is None:
        return False
    return driver[0] < compat[0]


@record(frozen=True)
class CompatLibrary:
    """The compat library found in an image: its folder (resolved inside the root),
    its version and note."""

    folder: str
    version: str
    note: CompatNote | None


def find_library(root: RootFS, folder: str) -> CompatLibrary | None:
    """The one regular ``libcuda.so.*.*`` file in ``folder`` inside ``root`` (None when
    there is no such folder, none or more than one such file)."""
    try:
        folder = normalize(folder)
        dfd = root.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, RootPathError):
        return None
    try:
        names = [
            n
            for n in sorted(os.listdir(dfd))
            if n.startswith(PREFIX) and "." in n[len(PREFIX) :] and _regular(dfd, n)
        ]
        if len(names) != 1:
            return None
        fd = _open_regular(dfd, names[0])
        if fd is None:
            return None
        try:
            note = read_note(fd)
        except (OSError, struct.error):
            note = None
        finally:
            os.close(fd)
        return CompatLibrary(_in_root(root, dfd, folder), names[0][len(PREFIX) :], note)
    finally:
        os.close(dfd)


def _open_regular(dfd: int, name: str) -> int | None:
    """``name`` in ``dfd`` opened for reading only if it is a regular file: identified
    through an O_PATH descriptor, then reopened through that very descriptor, so a FIFO
    or device node swapped in is never opened."""
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(path_fd).st_mode):
            return None
        return os.open(f"self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=kernel.host_proc())
    except OSError:
        return None
    finally:
        os.close(path_fd)


def _regular(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _in_root(root: RootFS, dfd: int, shown: str) -> str:
    """The container path of directory ``dfd`` with symlinks resolved (what NVIDIA's
    hook writes), from the kernel's name for it relative to the root's."""
    proc = kernel.host_proc()
    try:
        here = os.readlink(f"self/fd/{dfd}", dir_fd=proc)
        top = os.readlink(f"self/fd/{root.fd}", dir_fd=proc)
    except OSError:
        return shown
    if top == "/":
        return here if here.startswith("/") else shown
    if here == top:
        return "/"
    return here[len(top) :] if here.startswith(top + "/") else shown


def compat_for(
    root: RootFS, host_driver: str, host_cuda: str, folder: str = DEFAULT_FOLDER
) -> CompatLibrary | None:
    """The image's compat library when NVIDIA's rule uses it on this host, else None."""
    if not host_driver and not host_cuda:
        return None
    found = find_library(root, folder)
    if found is None or not use_compat(found.version, found.note, host_driver, host_cuda):
        return None
    return found


def enable_cuda_compat(
    root: RootFS, host_driver: str, host_cuda: str, folder: str | None = None
) -> dict[str, object]:
    """The container half: write (or, when the rule no longer holds, remove) nvshim's
    compat drop-in. Returns log fields."""
    found = compat_for(root, host_driver, host_cuda, folder or DEFAULT_FOLDER)
    try:
        if found is None:
            _remove(root, CONF_FILE)
            return {"cuda_compat": "not-used"}
        text = f"{found.folder}\n".encode()
        if not root.holds(CONF_FILE, text):  # a restart finds it written
            root.write_file(CONF_FILE, text, mode=0o644)
    except (OSError, RootPathError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise NvshimError(f"{CONF_FILE} in the container root: {reason}") from None
    return {"cuda_compat": found.version, "cuda_compat_folder": found.folder}


def _remove(root: RootFS, path: str) -> None:
    try:
        pfd, name = root.parent(path, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:  # looked at first: an unlink on a read-only root fails even for a missing file
        os.stat(name, dir_fd=pfd, follow_symlinks=False)
        os.unlink(name, dir_fd=pfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(pfd)


def enabled_folders(root: RootFS) -> list[str]:
    """The folders nvshim's compat drop-in names (``update-ldcache`` puts them first)."""
    try:
        data = root.read(CONF_FILE, 1 << 16)
    except (OSError, RootPathError):
        return []
    folders = []
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("/"):
            try:
                folders.append(normalize(line))
            except RootPathError:
                continue
    return folders


def in_image(rootfs: str, host_driver: str, host_cuda: str = "", folder: str | None = None):
    """``compat_for`` on the image root at host path ``rootfs`` (before the container
    exists: the runtime's create, a createRuntime hook). None when it cannot be opened."""
    try:
        root = RootFS(rootfs)
    except OSError:
        return None
    with root:
        return compat_for(root, host_driver, host_cuda, folder or DEFAULT_FOLDER)


def judged_versions(found: CompatLibrary | None, driver: str, cuda: str) -> tuple[str, str]:
    """(driver, CUDA) versions a container's ``NVIDIA_REQUIRE_*`` are judged against:
    the compat library's when it is used (its note's CUDA version, else derived from its
    driver version), else the host's."""
    if found is None:
        return driver, cuda
    wanted = found.note.cuda_version if found.note is not None else ""
    return found.version, wanted if parse_version(wanted) is not None else ""
