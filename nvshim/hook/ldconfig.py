"""``update-ldcache``: make injected library folders visible to the container's linker.

An image without a glibc dynamic loader (static or musl programs only) never reads an
ld.so cache, and if every library in the folders already resolves through the
container's ``/etc/ld.so.cache`` (parsed here, fd-based), nothing is written. Otherwise
the folders are listed in ``/etc/ld.so.conf.d/00-nvshim.conf`` (a later ldconfig in the
container keeps them) and the libraries are added to the image's cache here, as the
host's ldconfig would cache them (``merged_cache``: the SONAME link, the ``.so`` link, a
library without a SONAME under its file name; in ldconfig's order, the image's entries,
glibc-hwcaps names and generator kept). No process runs, and nothing in the image but
the cache, the folders' listings and the new libraries' ELF headers is read.

Where that cannot be done exactly (a name the cache already holds, a link ldconfig would
make first, a cache it cannot read or write back as read) the *host's* statically
linked ldconfig, opened as an fd before anything else, runs sealed: a thread of its own
makes a
private copy of the mount namespace, detaches every procfs mount under the root (no
magic link such as ``/proc/1/root`` can lead it out), enters a detached read-only tmpfs
holding a copy of the ldconfig fd's bytes (made once a process and kept while the file is
the same) as the thread's root and ``posix_spawn``s it from there, with an almost empty
environment and the root (checked against the root's fd; bound onto itself and made
``nodev`` with every mount below it: no device node in the image can be opened) as its
working directory, into which ``ldconfig -r .`` chroots before it reads anything; the
thread's fd table is its own, closed on exec but for ldconfig's stdio. No fork of the
calling process, whose pages a fork would copy. Nothing from the image is ever executed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import posixpath
import select
import stat
import struct
import time

from nvshim.errors import NvshimError
from nvshim.ldcache import (
    FLAG_ELF_LIBC6,
    FLAG_TYPE_MASK,
    LdCacheError,
    LdCacheFile,
    read_ld_cache,
    render_ld_cache,
    text,
    with_entries,
)
from nvshim.record import record, replace
from nvshim.rootfs import kernel
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize
from nvshim.rootfs.mountinfo import mounts
from nvshim.rootfs.namespace import in_thread

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Callable

HOST_LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
CACHE = "/etc/ld.so.cache"
CONF = "/etc/ld.so.conf"
CONF_DIR = "/etc/ld.so.conf.d"
CONF_FILE = f"{CONF_DIR}/00-nvshim.conf"
AUX_CACHE = "/var/cache/ldconfig/aux-cache"
# what ldconfig opens besides its configuration and the libraries: its auxiliary cache
# (read) and the temporary files it writes both caches to (O_CREAT opens a FIFO or a
# device node already there: it blocked on one, and wrote the cache into another)
CACHE_FILES = (AUX_CACHE, f"{CACHE}~", f"{AUX_CACHE}~")
# what the host ldconfig scans besides the folders it is given and its configuration's:
# its built-in trusted directories (multiarch ones on Debian-built ldconfigs)
MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu", "powerpc64le-linux-gnu",
             "i386-linux-gnu", "arm-linux-gnueabihf")  # fmt: skip
TOPS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib32", "/usr/lib32")
TRUSTED_DIRS = (*TOPS, *(f"{top}/{arch}" for arch in MULTIARCH for top in TOPS[:2]))
# subdirectories ldconfig descends into (hwcap platforms, glibc-hwcaps and what is in it)
HWCAP_DIRS = ("glibc-hwcaps", "tls", "x86_64", "haswell", "xeon_phi", "i686", "i586",
              "sse2", "avx512_1", "aarch64", "power8", "power9", "power10")  # fmt: skip
SCAN_LIMIT = 200_000  # directory entries looked at, at most (the deadline covers more)
CONF_BYTES = 16 << 20  # configuration files read in all, at most (an image's: a few KiB)
MAX_CACHE_BYTES = 8 << 20  # read and parsed here: 0.2 s at most (a real one: < 1 MiB)
LDCONFIG_ENV = {"LC_ALL": "C"}
LDCONFIG_TIMEOUT = 20.0  # a backstop: what could block it was refused beforehand
# The PT_INTERP of glibc programs on each architecture: the only readers of ld.so.cache.
GLIBC_LOADERS = (
    "/lib64/ld-linux-x86-64.so.2",  # x86_64
    "/lib/ld-linux-aarch64.so.1",  # aarch64
    "/lib64/ld64.so.2",  # ppc64le
    "/lib/ld-linux.so.2",  # i386 (compat32)
    "/lib/ld-linux-armhf.so.3",  # armhf
)
PT_INTERP = 3
PT_DYNAMIC = 2
PT_LOAD = 1
DT_SONAME = 14
DT_STRTAB = 5
# e_machine of a 64-bit library -> the flags ldconfig caches it with (FLAG_ELF_LIBC6 and
# the architecture's: "64-bit libraries are always libc.so.6+")
LIB64_FLAGS = {62: 0x0303, 183: 0x0A03, 21: 0x0503}  # x86-64, aarch64, ppc64
# e_machine of the 32-bit libraries ldconfig caches on those hosts (i386, x32, arm): this
# step counts them but leaves their entries (flags read from DT_NEEDED) to ldconfig
LIB32_MACHINES = frozenset((3, 62, 40))


# (endianness, [(p_type, p_offset, p_vaddr, p_filesz, 0)], e_machine, 64-bit)
ElfHeaders = tuple[str, list[tuple[int, int, int, int, int]], int, bool]


def _elf_headers(fd: int) -> ElfHeaders | None:
    """(endianness, [(p_type, p_offset, p_vaddr, p_filesz, 0)], e_machine, 64-bit) of a
    32- or 64-bit ELF file."""
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    wide = head[4] == 2
    end = "<" if head[5] == 1 else ">"
    if wide:
        if len(head) < 64:
            return None
        (phoff,) = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
    else:
        (phoff,) = struct.unpack_from(end + "I", head, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
    if phentsize != (56 if wide else 32) or phnum > 512:  # an Elf_Phdr: at most 28 KiB read
        return None
    table = os.pread(fd, phentsize * phnum, phoff)
    (machine,) = struct.unpack_from(end + "H", head, 18)
    headers = []
    for i in range(len(table) // phentsize):
        if wide:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                end + "IIQQQQ", table, i * phentsize
            )
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                end + "IIIII", table, i * phentsize
            )
        headers.append((p_type, p_offset, p_vaddr, p_filesz, 0))
    return end, headers, machine, wide


def is_static_elf(fd: int) -> bool:
    """True for a 64-bit ELF file without a PT_INTERP header (no dynamic loader)."""
    parsed = _elf_headers(fd)
    return parsed is not None and parsed[3] and all(h[0] != PT_INTERP for h in parsed[1])


def elf_library(fd: int) -> tuple[str | None, int | None]:
    """(DT_SONAME, the ld.so.cache flags ldconfig gives it) of an ELF shared object: no
    SONAME if it has none or is not ELF; no flags for a 32-bit one or an architecture
    ``LIB64_FLAGS`` does not name."""
    return _elf_library(fd)[:2]


def _elf_library(fd: int) -> tuple[str | None, int | None, bool]:
    """``elf_library``, and whether ldconfig would cache the file: a 64-bit ELF file with
    flags or a SONAME, a 32-bit one of ``LIB32_MACHINES`` or with a SONAME."""
    parsed = _elf_headers(fd)
    if parsed is None:
        return None, None, False
    soname, machine, wide = _soname(fd, parsed), parsed[2], parsed[3]
    flags = LIB64_FLAGS.get(machine) if wide else None
    cached = soname is not None or (flags is not None if wide else machine in LIB32_MACHINES)
    return soname, flags, cached


def _soname(fd: int, parsed: ElfHeaders) -> str | None:
    end, headers, _machine, wide = parsed
    dyn = next((h for h in headers if h[0] == PT_DYNAMIC), None)
    if dyn is None or dyn[3] > 1 << 20:
        return None
    data = os.pread(fd, dyn[3], dyn[1])
    soname = strtab = None
    size, entry = (16, end + "qQ") if wide else (8, end + "iI")
    for i in range(len(data) // size):
        tag, value = struct.unpack_from(entry, data, i * size)
        if tag == 0:
            break
        if tag == DT_SONAME:
            soname = value
        elif tag == DT_STRTAB:
            strtab = value
    if soname is None or strtab is None:
        return None
    for p_type, p_offset, p_vaddr, p_filesz, _ in headers:  # vaddr -> file offset
        if p_type == PT_LOAD and p_vaddr <= strtab < p_vaddr + p_filesz:
            raw = os.pread(fd, 256, p_offset + strtab - p_vaddr + soname)
            return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None
    return None


def open_host_ldconfig(path: str | None = None) -> int:
    """An fd of the host's ldconfig (checked to be a statically linked ELF file)."""
    candidates = [path] if path else list(HOST_LDCONFIG)
    for candidate in candidates:
        if not candidate.startswith("/"):
            raise NvshimError(f"--ldconfig {candidate!r}: must be an absolute host path")
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise NvshimError(f"{candidate}: cannot open: {err.strerror}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111 or not is_static_elf(fd):
            os.close(fd)
            raise NvshimError(f"{candidate}: not a statically linked executable; refusing to run")
        return fd
    raise NvshimError(f"host ldconfig not found (tried {', '.join(candidates)})")


def folder_paths(folders: list[str]) -> list[str]:
    """Validated, normalized, de-duplicated folder paths."""
    out: list[str] = []
    for folder in folders:
        try:
            path = normalize(folder)
        except RootPathError as err:
            raise NvshimError(f"--folder: {err}") from None
        if path not in out:
            out.append(path)
    return out


def _is_library_name(name: str) -> bool:
    return name.startswith("lib") and (name.endswith(".so") or ".so." in name)


def unreachable(root: RootFS, folders: list[str]) -> list[str]:
    """Libraries in ``folders`` the container's current ld.so.cache does not lead to.

    A cache entry names a path (usually the SONAME link); it leads to the file it is,
    or the file its link chain inside the same folder ends at. A 64-bit ELF library
    without a SONAME counts under its file name (ldconfig caches it so); a file that is
    not ELF does not count.
    """
    return [lib.path for lib in _unreached(root, folders, image_cache(root))]


@record(frozen=True)
class Unreached:
    """A library file no cache entry leads to, and what ldconfig would cache it as: its
    SONAME (its file name where it has none), the flags (None: an architecture not
    known here), whether the link named after its SONAME in its folder leads to it, and
    the ``.so`` links in its folder that lead to it (``dev_links``: ldconfig caches each
    whose name begins its SONAME under that name)."""

    folder: str
    name: str
    soname: str
    flags: int | None
    linked: bool
    dev_links: tuple = ()

    @property
    def path(self) -> str:
        return posixpath.join(self.folder, self.name)


def image_cache(root: RootFS) -> LdCacheFile:
    """The container's ld.so.cache as read (none: no entries), its ``problem`` why it
    cannot be added to: not a regular file, too large, empty, not a cache, not one to
    write back as read."""
    try:
        data = root.read(CACHE, MAX_CACHE_BYTES)
    except (OSError, RootPathError) as err:
        return LdCacheFile([], problem=f"{CACHE}: {_why(err)}")
    if data is None:
        return LdCacheFile([])
    if not data:  # what a crash may leave (not fsynced): the entries it had are unknown
        return LdCacheFile([], problem=f"{CACHE}: empty")
    try:
        cache = read_ld_cache(data)
    except (LdCacheError, struct.error) as err:
        return LdCacheFile([], problem=f"{CACHE}: {err}")
    return replace(cache, problem=f"{CACHE}: {cache.problem}") if cache.problem else cache


def _why(err: Exception) -> object:
    """An OSError's text without its errno (or the error itself)."""
    return getattr(err, "strerror", None) or err


def _unreached(root: RootFS, folders: list[str], cache: LdCacheFile) -> list[Unreached]:
    """``unreachable``'s libraries, with what adding each to the cache needs. A 64-bit
    ELF library without a SONAME counts under its file name (ldconfig caches it so)."""
    cached = _cached_names(root, cache, {posixpath.basename(f) for f in folders})
    missing: list[Unreached] = []
    for folder in folders:
        try:
            dfd = root.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            st = os.fstat(dfd)
            missing += _unreached_in(dfd, folder, cached.get((st.st_dev, st.st_ino), set()))
        finally:
            os.close(dfd)
    return missing


def _cached_names(
    root: RootFS, cache: LdCacheFile, basenames: set[str]
) -> dict[tuple[int, int], set[str]]:
    """The names the cache's libc6 entries give in each folder, by the folder's identity
    (device, inode) in the root: ``/lib/x86_64-linux-gnu`` in an image whose ``/lib`` is
    ``usr/lib`` is ``/usr/lib/x86_64-linux-gnu``. Only folders named like one of
    ``basenames`` are looked up (an image's cache names a handful of folders)."""
    by_path: dict[str, set[str]] = {}
    for flags, _key, value, _osv, _hwcap in cache.entries:
        if flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6:
            folder, name = posixpath.split(text(value))
            by_path.setdefault(folder, set()).add(name)
    cached: dict[tuple[int, int], set[str]] = {}
    for folder, names in by_path.items():
        if posixpath.basename(folder) not in basenames:
            continue
        try:
            st = root.stat(folder)
        except (OSError, RootPathError):
            continue
        if stat.S_ISDIR(st.st_mode):
            cached.setdefault((st.st_dev, st.st_ino), set()).update(names)
    return cached


def _unreached_in(dfd: int, folder: str, cached: set[str]) -> list[Unreached]:
    """The unreached libraries of one folder (``dfd``), given the names cached in it."""
    reached = {_chase(dfd, folder, name) for name in cached}
    found: dict[str, Unreached] = {}
    dev: list[str] = []
    with os.scandir(dfd) as listing:  # types from the listing: no stat per entry
        names = sorted((e.name, e.is_symlink(), e.is_file(follow_symlinks=False))
                       for e in listing if _is_library_name(e.name))  # fmt: skip
    for name, link, regular in names:
        if name in reached:
            continue
        if link and name.endswith(".so"):
            dev.append(name)
        if not regular:
            continue
        soname, flags, cached = _library_at(dfd, name)
        if cached:  # ldconfig would cache it
            soname = soname or name
            linked = "/" not in soname and _chase(dfd, folder, soname) == name
            found[name] = Unreached(folder, name, soname, flags, linked)
    for link in dev:
        lib = found.get(_chase(dfd, folder, link) or "")
        if lib and link != lib.soname and lib.soname.startswith(link):
            found[lib.name] = replace(lib, dev_links=(*lib.dev_links, link))
    return list(found.values())


def _chase(dfd: int, folder: str, name: str) -> str | None:
    """The regular file ``name`` leads to within its folder (links followed by name)."""
    for _ in range(8):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISREG(st.st_mode):
            return name
        if not stat.S_ISLNK(st.st_mode):
            return None
        try:
            target = os.readlink(name, dir_fd=dfd)
        except OSError:
            return None
        if target.startswith(folder + "/"):
            target = target[len(folder) + 1 :]
        if not target or "/" in target:
            return None
        name = target
    return None


def _library_at(dfd: int, name: str) -> tuple[str | None, int | None, bool]:
    """``_elf_library`` of the file ``name`` in ``dfd`` (nothing for what cannot be read).

    Kept per file identity (device, inode, size, mtime, ctime) in ``_LIBRARIES``: a
    worker of nvshim-runtimed sees the same bind-mounted driver libraries create after
    create, and looks each up with one ``lstat``. What is kept was read through the fd
    whose identity it is kept under."""
    try:
        known = _LIBRARIES.get(_identity(os.stat(name, dir_fd=dfd, follow_symlinks=False)))
    except OSError:
        return None, None, False
    if known is not None:
        return known
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None, None, False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the listing
            return None, None, False
        found = _elf_library(fd)
    except (OSError, struct.error):
        return None, None, False
    finally:
        os.close(fd)
    if len(_LIBRARIES) >= _LIBRARIES_KEPT:  # the image's own libraries come and go
        _LIBRARIES.clear()
    _LIBRARIES[_identity(st)] = found
    return found


def remember_libraries(paths: list[str]) -> None:
    """Read the ELF headers of the host's library files ``paths`` into what
    ``_library_at`` keeps: nvshim-runtimed's parent, before it forks its workers. A
    library bind-mounted into a container has its host file's identity, so each worker
    finds the driver's libraries already read. What cannot be read is left out."""
    for path in paths:
        folder, name = posixpath.split(path)
        try:
            dfd = os.open(folder or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            _library_at(dfd, name)
        finally:
            os.close(dfd)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """A file's identity for what this process keeps of it: device, inode, size, mtime,
    ctime (a change to its content moves the last)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


# what _library_at read, by file identity (a long-lived worker's; a hook reads each once)
_LIBRARIES: dict[tuple[int, ...], tuple[str | None, int | None, bool]] = {}
_LIBRARIES_KEPT = 512


def has_glibc_loader(root: RootFS) -> bool:
    """True when the image holds a glibc dynamic loader (a regular file, found within
    the root), i.e. something in it can read an ld.so cache."""
    for path in GLIBC_LOADERS:
        try:
            if stat.S_ISREG(root.stat(path).st_mode):
                return True
        except OSError:
            continue
    return False


def update_ldcache(root: RootFS, folders: list[str], ldconfig_fd: int) -> dict[str, object]:
    """Skip when nothing in the image reads an ld.so cache or every library is already
    reachable through it; else list the folders in the conf file and add the libraries
    to the image's cache as ldconfig would (``merged_cache``), or, where that cannot be
    done exactly, run the host ldconfig.

    Returns log fields including the time the check and the update took (ms), and
    which wrote the cache (``writer``: nvshim, or ldconfig with the reason in ``merge``).
    """
    folders = folder_paths(folders)
    started = time.perf_counter()
    loader = has_glibc_loader(root)
    cache = image_cache(root) if loader else LdCacheFile([])
    missing = _unreached(root, folders, cache) if loader else []
    fields: dict[str, object] = {
        "folders": ",".join(folders),
        "check_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    if not loader:
        fields["ldcache"] = "skipped-no-glibc-loader"
        return fields
    drop_in = "# nvshim-hook update-ldcache: injected driver libraries\n" + "\n".join(folders)
    drop_in_bytes = (drop_in + "\n").encode()
    if not missing:
        if not root.holds(CONF_FILE, drop_in_bytes) and _written_before(root):
            _write(root, CONF_FILE, lambda: root.write_file(CONF_FILE, drop_in_bytes))
        fields["ldcache"] = "skipped-reachable"
        return fields
    fields["unreachable"] = len(missing)
    started = time.perf_counter()
    merged, declined = merged_cache(cache, missing)
    if merged is None:
        fields["merge"] = declined
        confs = refuse_special_confs(root)
        refuse_special_caches(root)
        refuse_special_libraries(root, [*folders, *conf_dirs(root, confs), *TRUSTED_DIRS])
    _write(root, CONF_FILE, lambda: root.write_file(CONF_FILE, drop_in_bytes))
    _write(root, CONF, lambda: root.create_exclusive(CONF, b"include /etc/ld.so.conf.d/*.conf\n"))
    if merged is not None:
        _write(root, CACHE, lambda: root.write_file(CACHE, merged))
    else:
        run_ldconfig(root, ldconfig_fd, folders)
    fields["update_ms"] = round((time.perf_counter() - started) * 1000, 2)
    fields["writer"] = "ldconfig" if merged is None else "nvshim"
    fields["ldcache"] = "updated"
    return fields


def _written_before(root: RootFS) -> bool:
    """Whether an earlier create of this container wrote the drop-in (a restart): then
    it must still say what it said, though a crash since may have left it empty (the
    writes are not fsynced)."""
    try:
        root.stat(CONF_FILE)
    except (OSError, RootPathError):
        return False
    return True


def _write(root: RootFS, path: str, write: Callable[[], object]) -> None:
    """``write()``, its failure one NvshimError naming ``path``."""
    try:
        write()
    except (OSError, RootPathError) as err:
        raise NvshimError(f"{path} in the container root: cannot write: {_why(err)}") from None


def merged_cache(cache: LdCacheFile, missing: list[Unreached]) -> tuple[bytes | None, str | None]:
    """(the image's cache with the entries ldconfig would add for ``missing``, None), or
    (None, why ldconfig must rebuild it instead): the cache cannot be read or written
    back as read (its ``problem``), a library's architecture or link is not the plain
    case (ldconfig would make the link), two libraries share a SONAME or one is already
    cached under it (ldconfig's rules choose between them)."""
    if cache.problem:
        return None, cache.problem
    added: dict[str, tuple[int, bytes, bytes, int, int]] = {}
    for lib in missing:
        if lib.flags is None:
            return None, f"{lib.path}: an architecture this step does not know"
        if not lib.linked:
            return None, f"{lib.path}: {lib.soname} in its folder does not lead to it"
        for name in (lib.soname, *lib.dev_links):
            if name in added:
                return None, f"{lib.path}: another library is cached as {name}"
            path = posixpath.join(lib.folder, name)
            added[name] = (lib.flags, name.encode(), path.encode(), 0, 0)
    try:
        return render_ld_cache(with_entries(cache, list(added.values()))), None
    except LdCacheError as err:
        return None, str(err)


def refuse_special_confs(root: RootFS) -> list[str]:
    """Raise NvshimError when a file the host ldconfig will open as configuration in the
    root is not a regular file (a FIFO would block it until its timeout, holding the
    caller and a daemon worker meanwhile), or includes itself (ldconfig follows the
    cycle until its deadline; looked at through one include after another, the files
    grew as N^4), or whose include lines name more than ``SCAN_LIMIT`` files in all
    (each one looked at: 1,000 files each including 1,000 others took 10 s), or that
    pass ``CONF_BYTES`` in all (each line parsed: 28 MB naming 2.7 million directories
    took 35 s; a file over 1 MiB was not parsed at all, though ldconfig reads it):
    ``/etc/ld.so.conf``, the entries of ``/etc/ld.so.conf.d`` (nvshim's include) and what
    ``include`` lines name, at any depth, each file once. Looked at through
    ``RootFS.stat``, which never blocks. Returns the configuration files found (regular
    files)."""
    found = []
    ours = [n for n in root.listdir(CONF_DIR) or () if n.endswith(".conf")]
    todo: list[tuple[str, tuple[int, int] | None]]
    todo = [(f"{CONF_DIR}/{n}", None) for n in sorted(ours, reverse=True)]
    todo.append((CONF, None))
    open_, done = set(), set()  # files whose includes are being looked at, and were
    budget, size = SCAN_LIMIT, 0
    while todo:
        path, leaving = todo.pop()
        if leaving is not None:
            open_.discard(leaving)
            done.add(leaving)
            continue
        try:
            st = root.stat(path)
        except OSError:
            continue  # absent or unreachable: ldconfig finds nothing there either
        if stat.S_ISDIR(st.st_mode):
            continue  # ldconfig reads no directory as configuration
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path)
        key = (st.st_dev, st.st_ino)
        if key in open_:
            raise NvshimError(
                f"{path} in the container root: includes itself, ld cache not updated"
            )
        if key in done:
            continue
        size += st.st_size
        if size > CONF_BYTES:
            raise NvshimError(
                f"{path} in the container root: the ld.so configuration passes "
                f"{CONF_BYTES >> 20} MiB, ld cache not updated"
            )
        found.append(path)
        open_.add(key)
        todo.append((path, key))
        names, cost = _included(root, path, budget)
        budget -= cost
        if budget < 0:
            raise NvshimError(
                f"{CONF} in the container root: its include lines name more than "
                f"{SCAN_LIMIT} files, ld cache not updated"
            )
        todo += [(name, None) for name in reversed(names)]
    return found


def refuse_special_caches(root: RootFS) -> None:
    """Raise NvshimError when a file of ``CACHE_FILES`` in the root (as ldconfig reaches
    it) is neither a regular file nor a directory. Looked at through ``RootFS.stat``."""
    for path in CACHE_FILES:
        try:
            mode = root.stat(path).st_mode
        except (OSError, RootPathError):
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise _not_regular(path)


def _not_regular(path: str) -> NvshimError:
    return NvshimError(f"{path} in the container root: not a regular file, ld cache not updated")


def conf_dirs(root: RootFS, confs: list[str]) -> list[str]:
    """The directories configuration files ``confs`` name (the lines that are not an
    ``include``; a legacy ``=TYPE`` suffix dropped), as ldconfig reads them; the first
    ``SCAN_LIMIT`` (the prescan looks at no more)."""
    dirs: list[str] = []
    for path in confs:
        if len(dirs) >= SCAN_LIMIT:
            return dirs[:SCAN_LIMIT]
        try:
            text = root.read(path, CONF_BYTES) or b""
        except (OSError, RootPathError):
            continue
        for line in text.decode("utf-8", "replace").splitlines():
            words = line.split("#", 1)[0].split()
            if words and words[0] not in ("include", "hwcap") and words[0].startswith("/"):
                dirs.append(words[0].split("=", 1)[0])
    return dirs


def _library_name(name: str) -> bool:
    """Whether ldconfig opens an entry of this name (``_dl_is_dso``: a shared object or
    the dynamic linker)."""
    return ".so" in name or name.startswith("ld-")


def refuse_special_libraries(root: RootFS, dirs: list[str]) -> None:
    """Raise NvshimError when an entry the host ldconfig would open in one of ``dirs``
    (a library name, followed through symlinks inside the root as ldconfig follows
    them chrooted; the hwcap subdirectories it descends into, at any depth) is neither a
    regular file nor a directory: a FIFO there blocks it. Looked at through ``RootFS.stat``
    (``O_PATH``), which never blocks; a missing target is ldconfig's warning, not an
    error. Past ``SCAN_LIMIT`` directories and entries the rest is left to
    ``LDCONFIG_TIMEOUT`` (2.7 million directories that are not there took 35 s)."""
    seen: set[tuple[int, int]] = set()
    todo = list(dict.fromkeys(dirs))
    budget = SCAN_LIMIT
    while todo and budget > 0:
        folder = todo.pop()
        budget -= 1
        try:
            st = root.stat(folder)
        except (OSError, RootPathError):
            continue
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        names = root.listdir(folder) or []
        budget -= len(names)
        hwcaps = posixpath.basename(folder) == "glibc-hwcaps"
        for name in names:
            sub = hwcaps or name in HWCAP_DIRS
            if not (sub or _library_name(name)):
                continue
            path = posixpath.join(folder, name)
            try:
                mode = root.stat(path).st_mode
            except (OSError, RootPathError):
                continue
            if stat.S_ISDIR(mode):
                if sub:
                    todo.append(path)
            elif not stat.S_ISREG(mode):
                raise _not_regular(path)


def _included(root: RootFS, path: str, limit: int) -> tuple[list[str], int]:
    """The files the ``include`` lines of configuration file ``path`` may name (for a
    glob in the last component every entry of its folder; relative patterns from
    ``path``'s directory, as ldconfig reads them), and what finding them cost (patterns
    and entries): once that passes ``limit``, what was found so far."""
    try:
        text = root.read(path, CONF_BYTES) or b""
    except (OSError, RootPathError):
        return [], 0
    found, cost = [], 0
    for line in text.decode("utf-8", "replace").splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 2 or words[0] != "include":
            continue
        for pattern in words[1:]:
            cost += 1
            if cost + len(found) > limit:
                return found, cost + len(found)
            pattern = posixpath.join(posixpath.dirname(path), pattern)
            folder, name = posixpath.split(pattern)
            if not any(c in name for c in "*?["):
                found.append(pattern)
                continue
            # every entry a glob could match (no fnmatch: it imports re on a GPU create)
            for entry in sorted(root.listdir(folder) or ()):
                if not entry.startswith("."):
                    found.append(posixpath.join(folder, entry))
    return found, cost + len(found)


def run_ldconfig(root: RootFS, ldconfig_fd: int, folders: list[str]) -> None:
    """Run the host ldconfig (``ldconfig_fd``) chrooted into ``root``, sealed: from a
    thread of its own, in a private copy of the caller's mount namespace (``_seal_and_spawn``),
    started with ``posix_spawn`` (a vfork: no copy of this process's pages)."""
    root_path = os.readlink(f"self/fd/{root.fd}", dir_fd=kernel.host_proc())  # as we see it
    root_st = os.fstat(root.fd)
    try:
        copy = ldconfig_copy(ldconfig_fd)
    except OSError as err:
        raise NvshimError(f"host ldconfig: cannot copy it to a tmpfs: {err.strerror}") from None
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)  # the host's, before leaving it
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:  # the thread starts in this thread's mount namespace, with its root and cwd
        child = in_thread(_seal_and_spawn, root_path, (root_st.st_dev, root_st.st_ino),
                          copy, folders, (null, write_end))  # fmt: skip
    except Exception as err:  # noqa: BLE001 - one line, as ldconfig's own failures
        os.close(read_end)
        detail = err
        if isinstance(err, OSError) and err.strerror:
            detail = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
        raise NvshimError(f"host ldconfig in the container root failed: {detail}") from None
    finally:
        os.close(null)
        os.close(write_end)
    output, status = _collect(read_end, child)
    if status != 0:
        first = output.decode("utf-8", "replace").strip().splitlines()
        detail = first[-1] if first else f"exit status {status}"
        raise NvshimError(f"host ldconfig in the container root failed: {detail}")


def _seal_and_spawn(
    root_path: str, root_id: tuple[int, int], copy: int, folders: list[str], stdio: tuple[int, int]
) -> int:
    """In a thread of its own: a private fd table in which every fd is closed on exec
    (the child inherits only ``stdio``: its stdin, and its stdout and stderr); a private
    copy of its mount namespace with every procfs under the root detached (no magic link
    such as ``/proc/1/root`` can lead out); the detached tmpfs ``copy`` holding the host
    ldconfig (``ldconfig_copy``) as this thread's root; ldconfig spawned from there with
    an almost empty environment, in the root (checked to be ``root_id``; bound onto
    itself, ``nodev`` with every mount below) as its working directory, into which its
    ``-r .`` chroots first; its pid."""
    kernel.unshare(kernel.CLONE_FILES | kernel.CLONE_FS)  # fds, root and cwd: this thread's
    # what the caller opens meanwhile is not in this table; what is here is closed when
    # the thread exits, and on exec (the fd scan below only on kernels before 5.11)
    actions = [(os.POSIX_SPAWN_DUP2, stdio[0], 0), (os.POSIX_SPAWN_DUP2, stdio[1], 1),
               (os.POSIX_SPAWN_DUP2, stdio[1], 2)]  # fmt: skip
    try:
        kernel.close_range(3, 0xFFFFFFFF, kernel.CLOSE_RANGE_CLOEXEC)
    except OSError:
        actions += _close_inherited()
    fds = []
    try:
        kernel.unshare(kernel.CLONE_NEWNS)  # a copy of the caller's (setns would reset root)
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        _detach_procfs(root_path)
        kernel.mount(root_path, root_path, None, kernel.MS_BIND | kernel.MS_REC)  # for _nodev
        top = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fds.append(top)
        st = os.fstat(top)
        if (st.st_dev, st.st_ino) != root_id:
            raise OSError(errno.ESTALE, "container root changed", root_path)
        _nodev(top)
        os.fchdir(copy)
        os.chroot(".")  # "/ldconfig" is the copy; nothing of the root can be executed
        os.fchdir(top)  # ldconfig -r . chroots into its working directory: the root
        argv = ["ldconfig", "-r", ".", *folders]
        return os.posix_spawn("/ldconfig", argv, LDCONFIG_ENV, file_actions=actions)
    finally:
        for fd in (*fds, *stdio):  # this table's copies (the caller closes its own)
            os.close(fd)


def _nodev(top: int) -> None:
    """Make the mount at the root ``top`` (the root bound onto itself in this thread's
    private mount namespace) and every mount below it ``nodev``: no device node in the
    root can be opened (one the prescan did not see, past its limit or put there after
    it: ldconfig wrote the ld cache into a host disk through one). Before Linux 5.12 (no
    ``mount_setattr``), left as they are."""
    try:
        kernel.mount_setattr(top, kernel.MOUNT_ATTR_NODEV, recursive=True)
    except OSError as err:
        if err.errno != errno.ENOSYS:
            raise


def _detach_procfs(root_path: str) -> None:
    """Detach every procfs mount at or under ``root_path`` in this thread's (private)
    mount namespace (two rounds: one stacked under another shows after the first); raise
    when one is left. Each round reads mountinfo once, and a read that finds none ends it."""
    for detached in range(3):
        procs = _proc_mounts_under(root_path)
        if not procs:
            return
        if detached == 2:
            break
        for mountpoint in sorted(procs, key=len):
            try:
                kernel.umount2(mountpoint, kernel.MNT_DETACH | kernel.UMOUNT_NOFOLLOW)
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.ENOENT):
                    raise
    raise OSError(errno.EBUSY, "a procfs mount under the container root could not be hidden")


# the host ldconfig's identity (device, inode, size, mtime, ctime) and a read-only
# detached tmpfs holding a copy of its bytes: made once a process (a daemon's workers
# share their parent's) and again when the file is another one or was changed
_copy: tuple[tuple[int, ...], int] | None = None


def ldconfig_copy(ldconfig_fd: int) -> int:
    """A detached tmpfs (fd, kept: do not close it) holding the bytes of the checked
    host ldconfig ``ldconfig_fd`` as ``ldconfig``, read-only where the kernel can make
    it so (5.12+); reachable only through this process's fd."""
    global _copy
    st = os.fstat(ldconfig_fd)
    key = _identity(st)
    if _copy is not None and _copy[0] == key:
        return _copy[1]
    tmpfs = kernel.private_tmpfs(f"{(st.st_size >> 10) + 64}k")
    try:
        _copy_in(ldconfig_fd, st.st_size, tmpfs)
        try:
            kernel.mount_setattr(tmpfs, kernel.MOUNT_ATTR_RDONLY | kernel.MOUNT_ATTR_NODEV)
        except OSError:
            pass  # before 5.12: writable, as a copy made per call would be
    except BaseException:
        os.close(tmpfs)
        raise
    if _copy is not None:
        os.close(_copy[1])
    _copy = (key, tmpfs)
    return tmpfs


def _copy_in(ldconfig_fd: int, size: int, tmpfs: int) -> None:
    """The host ldconfig's bytes, read through its checked fd, as ``ldconfig`` (mode
    0500) in the detached tmpfs ``tmpfs`` (closed before it is executed)."""
    out = os.open("ldconfig", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o500,
                  dir_fd=tmpfs)  # fmt: skip
    try:
        offset = 0
        while offset < size:
            sent = os.sendfile(out, ldconfig_fd, offset, size - offset)
            if sent == 0:
                raise OSError(errno.EIO, "the host ldconfig shrank while copied")
            offset += sent
    finally:
        os.close(out)


def _close_inherited() -> list[tuple[int, int]]:
    """``posix_spawn`` actions closing every fd above 2 this thread would pass on."""
    proc = kernel.host_proc()
    listing = os.open("thread-self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    try:
        numbers = [int(n) for n in os.listdir(listing) if n.isdigit()]
    finally:
        os.close(listing)
    actions = []
    for fd in numbers:
        if fd > 2 and fd != listing:
            try:
                if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                continue
    return actions


def _proc_mounts_under(root_path: str) -> list[str]:
    """Mount points of procfs mounts at or below ``root_path`` (this thread's mountinfo)."""
    prefix = root_path.rstrip("/") + "/"
    found = []
    for point, fstype, _options in mounts():
        if fstype == "proc" and (point == root_path or point.startswith(prefix)):
            found.append(point)
    return found


def _collect(read_end: int, child: int) -> tuple[bytes, int]:
    """Output of the child (up to 64 KiB kept) and its exit status; killed on timeout."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + LDCONFIG_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(child, 9)
                chunks.append(b"timed out")
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            if sum(map(len, chunks)) < 65536:
                chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(child, 0)
    return b"".join(chunks), os.waitstatus_to_exitcode(status)
