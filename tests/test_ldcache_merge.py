"""The ld-cache step adds injected libraries to an image's ld.so.cache itself (nvshim.ldcache,
``merged_cache``) instead of running the host ldconfig: checked against the real ldconfig
and the real dynamic loader.

Each image is built, its cache made by the host's ``ldconfig -r``, driver libraries put in
(as the runtime's mounts and the create-symlinks step would), then the step runs on one
copy and the host ldconfig (what the step ran before) on another: ``ldconfig -p`` lists
the same libraries, each leading to the same file. Where the step cannot add to the
cache exactly it runs ldconfig, and says why.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import stat
import subprocess
import time

import pytest

from nvshim.hook.ldconfig import CACHE, open_host_ldconfig, update_ldcache
from nvshim.ldcache import LdCacheError, LdCacheFile, parse_ld_cache, read_ld_cache, with_entries
from nvshim.rootfs.fsroot import RootFS
from tests.runc_util import build_stub_library, in_private_mount_ns
from tests.sim.compile import stubs as sim_stubs

LIB = "/usr/lib/x86_64-linux-gnu"
NV = "/usr/local/nvidia/lib64"  # a folder outside the loader's default search path
VERSION = "550.90.12"
LOADER = "/lib64/ld-linux-x86-64.so.2"

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 libraries")


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    """Compiled once: image libraries and driver libraries (file name -> SONAME)."""
    out = tmp_path_factory.mktemp("stubs")
    made = {}
    for name, soname in [
        ("libzeta.so.3.1", "libzeta.so.3"), ("libapp.so.1.0", "libapp.so.1"),
        ("libfoo10.so.2", "libfoo10.so.2"), ("libfoo9.so.2", "libfoo9.so.2"),
        ("libnvidia-zz.so.1", "libnvidia-zz.so.1"), ("libA.so.7", "libA.so.7"),
        ("libhw.so.1", "libhw.so.1"), ("libcuda.so.550.90.12", "libcuda.so.1"),
        ("libnvidia-ml.so.550.90.12", "libnvidia-ml.so.1"),
        ("libnvidia-ptxjitcompiler.so.550.90.12", "libnvidia-ptxjitcompiler.so.1"),
        ("libnvidia-glsi.so.550.90.12", "libnvidia-glsi.so.550.90.12"),
        ("libnvidia-plain.so.550.90.12", ""),
    ]:  # fmt: skip
        made[name] = build_stub_library(out / name, soname)
    return made


def _put(root, folder, stubs, name, links=()):
    """Copy stub ``name`` into ``folder`` of ``root`` with relative ``links`` to it."""
    where = os.path.join(root, folder.lstrip("/"))
    os.makedirs(where, exist_ok=True)
    shutil.copyfile(stubs[name], os.path.join(where, name))
    for link, target in links:
        os.symlink(target, os.path.join(where, link))


def make_image(root, stubs, merged_usr=True, hwcaps=True):
    """A glibc image: the loader and libc, libraries in LIB (a dev link, a library
    without links), one in a glibc-hwcaps subdirectory, one in a folder its
    configuration lists; its cache made by the host ldconfig."""
    root = str(root)
    os.makedirs(os.path.join(root, "usr/lib"))
    if merged_usr:
        os.symlink("usr/lib", os.path.join(root, "lib"))
    os.makedirs(os.path.join(root, "lib64"), exist_ok=True)
    shutil.copyfile(os.path.realpath(LOADER), os.path.join(root, LOADER.lstrip("/")))
    os.chmod(os.path.join(root, LOADER.lstrip("/")), 0o755)
    os.makedirs(os.path.join(root, LIB.lstrip("/")))
    libc = subprocess.run(["gcc", "-print-file-name=libc.so.6"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    shutil.copyfile(os.path.realpath(libc), os.path.join(root, LIB.lstrip("/"), "libc.so.6"))
    _put(root, LIB, stubs, "libzeta.so.3.1", [("libzeta.so.3", "libzeta.so.3.1"),
                                              ("libzeta.so", "libzeta.so.3")])  # fmt: skip
    for name in ("libfoo10.so.2", "libfoo9.so.2", "libnvidia-zz.so.1", "libA.so.7"):
        _put(root, LIB, stubs, name)
    if hwcaps:
        _put(root, f"{LIB}/glibc-hwcaps/x86-64-v2", stubs, "libhw.so.1")
        _put(root, LIB, stubs, "libhw.so.1")
    _put(root, "/opt/app/lib", stubs, "libapp.so.1.0", [("libapp.so.1", "libapp.so.1.0")])
    os.makedirs(os.path.join(root, "etc/ld.so.conf.d"))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as fh:
        fh.write("include /etc/ld.so.conf.d/*.conf\n")
    with open(os.path.join(root, "etc/ld.so.conf.d/app.conf"), "w") as fh:
        fh.write("/opt/app/lib\n")
    subprocess.run(["ldconfig", "-r", root], check=True)
    return root


def inject(root, folder, stubs):
    """Driver libraries in ``folder``, with the links create-symlinks makes."""
    v = VERSION
    _put(root, folder, stubs, f"libcuda.so.{v}", [("libcuda.so.1", f"libcuda.so.{v}"),
                                                 ("libcuda.so", "libcuda.so.1")])  # fmt: skip
    _put(root, folder, stubs, f"libnvidia-ml.so.{v}", [("libnvidia-ml.so.1",
                                                       f"libnvidia-ml.so.{v}")])  # fmt: skip
    _put(root, folder, stubs, f"libnvidia-ptxjitcompiler.so.{v}",
         [("libnvidia-ptxjitcompiler.so.1", f"libnvidia-ptxjitcompiler.so.{v}")])  # fmt: skip
    _put(root, folder, stubs, f"libnvidia-glsi.so.{v}")
    _put(root, folder, stubs, f"libnvidia-plain.so.{v}")


def step(root, folder):
    """The ld-cache step on ``root`` (in a child with its own mount namespace: where
    it runs ldconfig); its log fields."""

    def work():
        fd = open_host_ldconfig()
        try:
            with RootFS(str(root)) as fs:
                return update_ldcache(fs, [folder], fd)
        finally:
            os.close(fd)

    result = in_private_mount_ns(work)
    assert "ok" in result, result
    return result["ok"]


def host_ldconfig(root, folder):
    """What the step did before: its configuration file, then the host ldconfig."""
    with open(os.path.join(root, "etc/ld.so.conf.d/00-nvshim.conf"), "w") as fh:
        fh.write(f"# injected\n{folder}\n")
    subprocess.run(["ldconfig", "-r", str(root), folder], check=True)


def listing(root) -> list[tuple[str, str, str]]:
    """``ldconfig -p`` of the root's cache, in file order: (name, flags, the file the
    path leads to, inside the root)."""
    out = subprocess.run(["ldconfig", "-p", "-C", os.path.join(root, CACHE.lstrip("/"))],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = []
    for name, flags, path in re.findall(r"^\t(\S+) \((.*)\) => (\S+)$", out, re.M):
        real = os.path.realpath(os.path.join(root, path.lstrip("/")))
        assert real.startswith(os.path.realpath(root) + "/"), (path, real)
        rows.append((name, flags, os.path.relpath(real, root)))
    return rows


def copies(root, tmp_path):
    a, b = tmp_path / "merged", tmp_path / "ldconfig"
    shutil.copytree(root, a, symlinks=True)
    shutil.copytree(root, b, symlinks=True)
    return a, b


@pytest.mark.parametrize("folder", [LIB, NV])
@pytest.mark.parametrize("merged_usr", [True, False])
def test_the_merged_cache_lists_what_ldconfig_lists(tmp_path, stubs, folder, merged_usr):
    """Driver libraries in an image folder (beside the image's own, ``/lib`` a link to
    ``usr/lib`` or not) or a folder of their own: the merged cache holds every entry
    ldconfig's has, in the same order, each leading to the same file, with the image's
    glibc-hwcaps entries and generator kept; the libraries with a SONAME link, a dev
    link or no SONAME are each cached as ldconfig caches them."""
    image = make_image(tmp_path / "image", stubs, merged_usr=merged_usr)
    before = listing(image)
    inject(image, folder, stubs)
    a, b = copies(image, tmp_path)
    fields = step(a, folder)
    host_ldconfig(b, folder)
    assert fields["writer"] == "nvshim" and "merge" not in fields, fields
    assert fields["unreachable"] == 5
    assert listing(a) == listing(b)
    names = [row[0] for row in listing(a)]
    v = VERSION
    for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", f"libnvidia-glsi.so.{v}",
                 f"libnvidia-plain.so.{v}", "libnvidia-ptxjitcompiler.so.1"):  # fmt: skip
        assert name in names
    kept = [row for row in listing(a) if row[2] in {r[2] for r in before}]
    assert [(n, f) for n, f, _ in kept] == [(n, f) for n, f, _ in before]  # the image's
    assert any("hwcap" in f for _, f, _ in before)
    with open(os.path.join(a, "etc/ld.so.cache"), "rb") as fh:
        merged = read_ld_cache(fh.read())
    assert merged.generator and merged.generator.startswith(b"ldconfig")
    assert merged.hwcaps == (b"x86-64-v2",)
    assert open(os.path.join(a, "etc/ld.so.conf.d/00-nvshim.conf")).read().endswith(f"\n{folder}\n")


def test_an_image_without_a_cache_gets_ldconfigs_entries_for_the_folder(tmp_path, stubs):
    """No cache in the image: the step writes one holding the folder's libraries (the
    image's there too, as ldconfig lists them), not the rest of the image's."""
    image = make_image(tmp_path / "image", stubs, hwcaps=False)
    os.unlink(os.path.join(image, "etc/ld.so.cache"))
    inject(image, LIB, stubs)
    a, b = copies(image, tmp_path)
    assert step(a, LIB)["writer"] == "nvshim"
    host_ldconfig(b, LIB)
    in_folder = [row for row in listing(b) if os.path.dirname(row[2]) == LIB.lstrip("/")]
    assert listing(a) == in_folder


def test_files_a_crash_left_empty_are_made_again_at_the_next_create(tmp_path, stubs):
    """The step does not fsync what it writes in a container's root: a node crash may
    leave the cache or the drop-in empty. The container's next create finds them so
    and makes them again; one that finds them as written changes nothing."""
    image = make_image(tmp_path / "image", stubs, hwcaps=False)
    inject(image, NV, stubs)
    a, b = copies(image, tmp_path)
    assert step(a, NV)["writer"] == "nvshim"
    host_ldconfig(b, NV)
    cache, drop_in = (os.path.join(a, p) for p in ("etc/ld.so.cache",
                                                   "etc/ld.so.conf.d/00-nvshim.conf"))  # fmt: skip
    written = open(drop_in).read()
    assert step(a, NV)["ldcache"] == "skipped-reachable"  # a restart
    assert open(drop_in).read() == written

    os.truncate(drop_in, 0)  # the cache survived, the drop-in did not
    assert step(a, NV)["ldcache"] == "skipped-reachable"
    assert open(drop_in).read() == written

    for path in (cache, drop_in):
        os.truncate(path, 0)
    fields = step(a, NV)
    assert fields["writer"] == "ldconfig" and "merge" in fields, fields  # no cache to add to
    assert open(drop_in).read() == written
    assert listing(a) == listing(b)


def test_32_bit_driver_libraries_are_cached_as_ldconfig_caches_them(tmp_path, stubs):
    """compat32: 32-bit driver libraries in their own folder beside the 64-bit ones. The
    step counts them (no cache entry leads to them) and leaves their entries to the host
    ldconfig (their flags come from what they link): the cache lists what the host
    ldconfig's lists, 32-bit entries included, and a restart finds them cached."""
    lib32 = "/usr/lib/i386-linux-gnu"
    built = sim_stubs([("libcuda.so.1", 32), ("libnvidia-ml.so.1", 32)])
    assert len(built) == 2, "gcc -m32 could not build the 32-bit stubs"
    image = make_image(tmp_path / "image", stubs, hwcaps=False)
    inject(image, LIB, stubs)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        name = soname.replace(".so.1", f".so.{VERSION}")
        _put(image, lib32, {name: built[(soname, 32)]}, name, [(soname, name)])
    a, b = copies(image, tmp_path)

    def work(root):
        fd = open_host_ldconfig()
        try:
            with RootFS(str(root)) as fs:
                return update_ldcache(fs, [LIB, lib32], fd)
        finally:
            os.close(fd)

    fields = in_private_mount_ns(lambda: work(a))["ok"]
    with open(os.path.join(b, "etc/ld.so.conf.d/00-nvshim.conf"), "w") as fh:
        fh.write(f"# injected\n{LIB}\n{lib32}\n")
    subprocess.run(["ldconfig", "-r", str(b), LIB, lib32], check=True)
    assert fields["unreachable"] == 7, fields
    assert fields["writer"] == "ldconfig" and "architecture" in fields["merge"], fields
    assert listing(a) == listing(b)
    assert [row for row in listing(a) if row[2].startswith(lib32[1:])], listing(a)
    again = in_private_mount_ns(lambda: work(a))["ok"]  # the container started again
    assert again["ldcache"] == "skipped-reachable", again


DL_PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        printf("%s %s\n", argv[i], h ? "ok" : "missing");
        failed += !h;
    }
    return failed != 0;
}
"""


def test_the_real_loader_finds_every_library_through_the_merged_cache(tmp_path, stubs):
    """In a chroot, glibc's own loader opens every name the merged cache holds: the
    driver libraries in a folder it never searches by itself (none of them found
    before the step), and the image's (its binary search runs over both)."""
    image = make_image(tmp_path / "image", stubs)
    subprocess.run(["gcc", "-o", os.path.join(image, "dl"), "-x", "c", "-"],
                   input=DL_PROGRAM, text=True, check=True)  # fmt: skip
    inject(image, NV, stubs)
    v = VERSION
    driver = ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
              f"libnvidia-glsi.so.{v}", f"libnvidia-plain.so.{v}"]  # fmt: skip
    own = ["libzeta.so.3", "libfoo10.so.2", "libfoo9.so.2", "libnvidia-zz.so.1", "libA.so.7",
           "libapp.so.1"]  # fmt: skip

    def dlopen(names):
        run = subprocess.run(["chroot", str(image), "/dl", *names], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        return dict(line.split() for line in run.stdout.splitlines())

    assert set(dlopen(driver).values()) == {"missing"}
    assert step(image, NV)["writer"] == "nvshim"
    assert dlopen(driver + own) == {name: "ok" for name in driver + own}


def _decline(tmp_path, stubs, spoil):
    """An image spoiled by ``spoil(root)``; the step's fields, and whether its cache
    then lists what ldconfig's does."""
    image = make_image(tmp_path / "image", stubs, hwcaps=False)
    inject(image, NV, stubs)
    a, b = copies(image, tmp_path)
    spoil(a)
    spoil(b)
    started = time.monotonic()
    fields = step(a, NV)
    assert time.monotonic() - started < 15
    host_ldconfig(b, NV)
    return fields, listing(a) == listing(b)


def _collide(root):
    """The image caches a libcuda.so.1 of its own, in another folder."""
    _put(root, "/opt/compat", {"libcuda.so.1": os.path.join(root, NV.lstrip("/"),
                                                           f"libcuda.so.{VERSION}")},
         "libcuda.so.1")  # fmt: skip
    with open(os.path.join(root, "etc/ld.so.conf.d/compat.conf"), "w") as fh:
        fh.write("/opt/compat\n")
    subprocess.run(["ldconfig", "-r", str(root), "-X"], check=True)


def _unlinked(root):
    """A driver library without the link named after its SONAME."""
    os.unlink(os.path.join(root, NV.lstrip("/"), "libnvidia-ml.so.1"))


def _write(data):
    def spoil(root):
        path = os.path.join(root, "etc/ld.so.cache")
        os.unlink(path)
        with open(path, "wb") as fh:
            fh.write(data)

    return spoil


def _fifo(root):
    path = os.path.join(root, "etc/ld.so.cache")
    os.unlink(path)
    os.mkfifo(path)


def _compat(root):
    """A cache in the old and new formats at once, with extensions behind the old table."""
    subprocess.run(["ldconfig", "-r", str(root), "-X", "-c", "compat"], check=True)


@pytest.mark.parametrize(
    "spoil, reason",
    [
        (_collide, "the cache has an entry of that name"),
        (_unlinked, "libnvidia-ml.so.1 in its folder does not lead to it"),
        (_write(b"garbage, not a cache"), "not an ld.so.cache file"),
        (_write(b"glibc-ld.so.cache1.1" + bytes(9 << 20)), "larger than"),
        (_fifo, "not a regular file"),
        (_compat, "extensions behind the old-format table"),
    ],
    ids=["same-name", "no-soname-link", "garbage", "too-large", "fifo", "compat-format"],
)
def test_where_it_cannot_add_exactly_the_step_runs_ldconfig_and_says_why(
    tmp_path, stubs, spoil, reason
):
    """A name the image already caches, a library ldconfig would link first, a cache
    that is not one, one over 8 MiB (never parsed), a FIFO (never opened), a format it
    cannot write back as read:
    the step runs the host ldconfig, whose cache the step's then is, and logs why."""
    fields, same = _decline(tmp_path, stubs, spoil)
    assert fields["writer"] == "ldconfig" and reason in fields["merge"], fields
    assert same


def test_a_symlinked_cache_is_replaced_inside_the_root(tmp_path, stubs):
    """``/etc/ld.so.cache`` a link to an absolute path: read and replaced inside the root
    (the link itself replaced by a file), nothing written where the link points on the
    host."""
    image = make_image(tmp_path / "image", stubs, hwcaps=False)
    inject(image, LIB, stubs)
    outside = tmp_path / "host-side"
    outside.mkdir()
    path = os.path.join(image, "etc/ld.so.cache")
    os.rename(path, os.path.join(image, "etc/real.cache"))
    os.symlink(str(outside / "cache"), path)  # absolute: the host's path, the root's too
    fields = step(image, LIB)
    assert fields["writer"] == "nvshim"
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert os.listdir(outside) == []
    with open(path, "rb") as fh:
        assert {"libcuda.so.1", "libcuda.so"} <= {e.name for e in parse_ld_cache(fh.read())}


TEMPLATE = "libQQQQQQQQQQQQ.so.QQQQQQ"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "lib.so"
    build_stub_library(path, TEMPLATE)
    data = path.read_bytes()
    assert data.count(TEMPLATE.encode()) == 1
    return data


def _names(rng: random.Random, count: int) -> list[str]:
    """Names of TEMPLATE's length whose order takes every rule of ``_dl_cache_libcmp``:
    digit runs against letters, numbers of other lengths, leading zeros, prefixes."""
    names, seen = [], set()
    while len(names) < count:
        stem = "".join(rng.choice("ab19_-0") for _ in range(12))
        tail = "".join(rng.choice("0123456789.") for _ in range(6))
        name = f"lib{stem}.so.{tail}"
        canonical = re.sub(r"\d+", lambda m: str(int(m.group())), name)
        if canonical not in seen:  # names equal as ldconfig compares them stay out
            seen.add(canonical)
            names.append(name)
    return names


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_entries_go_where_ldconfig_puts_them(tmp_path, template, seed):
    """Libraries of random names (patched into one compiled stub): half cached by
    ldconfig, the other half added by ``with_entries`` in random order, give ldconfig's
    order for all of them, and all of them added to an empty cache give it too."""
    rng = random.Random(seed)
    names = _names(rng, 120)
    root = tmp_path / "root"
    folder = root / "lib"
    folder.mkdir(parents=True)
    (root / "etc").mkdir()
    for name in names[:60]:
        (folder / name).write_bytes(template.replace(TEMPLATE.encode(), name.encode()))
    subprocess.run(["ldconfig", "-r", str(root), "-X", "/lib"], check=True)
    half = read_ld_cache((root / "etc/ld.so.cache").read_bytes())
    for name in names[60:]:
        (folder / name).write_bytes(template.replace(TEMPLATE.encode(), name.encode()))
    subprocess.run(["ldconfig", "-r", str(root), "-X", "/lib"], check=True)
    full = [e[1] for e in read_ld_cache((root / "etc/ld.so.cache").read_bytes()).entries]
    assert sorted(full) == sorted(n.encode() for n in names)
    rest = [(0x303, n.encode(), b"/lib/" + n.encode(), 0, 0) for n in names[60:]]
    rng.shuffle(rest)
    assert [e[1] for e in with_entries(half, rest).entries] == full
    everything = [(0x303, n.encode(), b"/lib/" + n.encode(), 0, 0) for n in names]
    rng.shuffle(everything)
    assert [e[1] for e in with_entries(LdCacheFile([]), everything).entries] == full


@pytest.mark.parametrize(
    "existing, added",
    [("libx.so.1", "libx.so.01"), ("libé.so.1", "liba.so.1"), ("liba.so.1", "liba.so.1234567890")],
    ids=["equal-by-number", "byte-over-0x7f", "digit-run-over-9"],
)
def test_a_name_whose_order_is_not_reproducible_is_refused(existing, added):
    """Equal to a cached name as ldconfig compares them, or an order C's char and int
    decide (a byte over 0x7f, a number over 9 digits): refused, never guessed."""
    cache = LdCacheFile([(0x303, existing.encode(), b"/lib/" + existing.encode(), 0, 0)])
    with pytest.raises(LdCacheError):
        with_entries(cache, [(0x303, added.encode(), b"/lib/" + added.encode(), 0, 0)])
