"""``update-ldcache``: make injected library folders visible to the container's linker.

An image without a glibc dynamic loader (static or musl programs only) never reads an
ld.so cache, and if every library in the folders already resolves through the
container's ``/etc/ld.so.cache`` (parsed here, fd-based), nothing runs. Otherwise the
folders are
listed in ``/etc/ld.so.conf.d/00-nvshim.conf`` and the *host's* statically linked
ldconfig, opened as an fd before anything else, runs sealed: a thread of its own makes a
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
from nvshim.ldcache import LdCacheError, parse_ld_cache
from nvshim.rootfs import kernel
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize
from nvshim.rootfs.mountinfo import mounts
from nvshim.rootfs.namespace import in_thread

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
MAX_CACHE_BYTES = 64 << 20
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


def _elf_headers(fd: int) -> tuple[str, list[tuple[int, int, int, int, int]]] | None:
    """(endianness, [(p_type, p_offset, p_vaddr, p_filesz, ...)]) of a 64-bit ELF file."""
    head = os.pread(fd, 64, 0)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] not in (1, 2):
        return None
    end = "<" if head[5] == 1 else ">"
    (phoff,) = struct.unpack_from(end + "Q", head, 32)
    phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
    if phentsize < 56 or phnum > 512:
        return None
    table = os.pread(fd, phentsize * phnum, phoff)
    headers = []
    for i in range(len(table) // phentsize):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            end + "IIQQQQ", table, i * phentsize
        )
        headers.append((p_type, p_offset, p_vaddr, p_filesz, 0))
    return end, headers


def is_static_elf(fd: int) -> bool:
    """True for a 64-bit ELF file without a PT_INTERP header (no dynamic loader)."""
    parsed = _elf_headers(fd)
    return parsed is not None and all(h[0] != PT_INTERP for h in parsed[1])


def elf_soname(fd: int) -> str | None:
    """DT_SONAME of a 64-bit ELF shared object, None if it has none or is not ELF."""
    parsed = _elf_headers(fd)
    if parsed is None:
        return None
    end, headers = parsed
    dyn = next((h for h in headers if h[0] == PT_DYNAMIC), None)
    if dyn is None or dyn[3] > 1 << 20:
        return None
    data = os.pread(fd, dyn[3], dyn[1])
    soname = strtab = None
    for i in range(len(data) // 16):
        tag, value = struct.unpack_from(end + "qQ", data, i * 16)
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
    or the file its link chain inside the same folder ends at. Library files without a
    SONAME are never cached by ldconfig and are not counted.
    """
    try:
        data = root.read(CACHE, MAX_CACHE_BYTES) or b""
        entries = parse_ld_cache(data) if data else []
    except (OSError, LdCacheError):
        entries = []
    cached: dict[str, set[str]] = {}
    for entry in entries:
        folder, name = posixpath.split(entry.path)
        cached.setdefault(folder, set()).add(name)
    missing: list[str] = []
    for folder in folders:
        try:
            dfd = root.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            reached = {_chase(dfd, folder, name) for name in cached.get(folder, ())}
            for name in sorted(os.listdir(dfd)):
                if name in reached or not _is_library_name(name):
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and _soname_at(dfd, name):
                    missing.append(posixpath.join(folder, name))
        finally:
            os.close(dfd)
    return missing


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


def _soname_at(dfd: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        return elf_soname(fd)
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)


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
    reachable through it; else write the conf file and run the host ldconfig.

    Returns log fields including the time the check and ldconfig took (ms).
    """
    folders = folder_paths(folders)
    started = time.perf_counter()
    loader = has_glibc_loader(root)
    missing = unreachable(root, folders) if loader else []
    fields: dict[str, object] = {
        "folders": ",".join(folders),
        "check_ms": round((time.perf_counter() - started) * 1000, 2),
    }
    if not loader:
        fields["ldcache"] = "skipped-no-glibc-loader"
        return fields
    if not missing:
        fields["ldcache"] = "skipped-reachable"
        return fields
    fields["unreachable"] = len(missing)
    confs = refuse_special_confs(root)
    refuse_special_caches(root)
    refuse_special_libraries(root, [*folders, *conf_dirs(root, confs), *TRUSTED_DIRS])
    text = "# nvshim-hook update-ldcache: injected driver libraries\n" + "\n".join(folders)
    try:
        root.write_file(CONF_FILE, (text + "\n").encode())
        root.create_exclusive(CONF, b"include /etc/ld.so.conf.d/*.conf\n")
    except (OSError, RootPathError) as err:
        raise NvshimError(f"{CONF_FILE} in the container root: cannot write: {err}") from None
    started = time.perf_counter()
    run_ldconfig(root, ldconfig_fd, folders)
    fields["ldconfig_ms"] = round((time.perf_counter() - started) * 1000, 2)
    fields["ldcache"] = "updated"
    return fields


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
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
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
