"""glibc's binary ``/etc/ld.so.cache`` (``glibc-ld.so.cache1.1``, optionally behind the
old ``ld.so-1.7.0`` table): read it, add entries where glibc's ldconfig would put them,
and write it back in the new format. Standard library only: the hook imports it.

The layout follows glibc's ``sysdeps/generic/dl-cache.h`` (header, entries, string table,
then the extension directory with the generator string and the glibc-hwcaps names); the
order is ldconfig's: descending by ``_dl_cache_libcmp`` (digit runs compared as numbers),
which the dynamic loader's binary search relies on.
"""

from __future__ import annotations

import struct
import sys

from nvshim.record import record

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_OLD_ENTRY_SIZE = 12
_EXT_HEADER = struct.Struct("<II")  # magic, count
_EXT_SECTION = struct.Struct("<IIII")  # tag, flags, offset, size
EXT_MAGIC = 0xEAA42174  # cache_extension_magic, (uint32_t) -358342284
TAG_GENERATOR, TAG_HWCAPS = 0, 1
ENDIAN_LITTLE = 2  # cache_file_new_flags_endian_little

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
ARCH_FLAGS = {
    0x0300: "x86_64",
    0x0800: "x32",
    0x0A00: "aarch64",
    0x0000: "32bit",
}

# (flags, key, value, osversion, hwcap) of one entry, strings as bytes
RawEntry = tuple[int, bytes, bytes, int, int]


class LdCacheError(ValueError):
    """The data is not a cache this module understands (or cannot write back as read)."""


@record(frozen=True)
class LdCacheEntry:
    """One library in the cache: ``name`` is the SONAME-like key, ``path`` its file."""

    name: str
    path: str
    flags: int

    @property
    def arch(self) -> str:
        return ARCH_FLAGS.get(self.flags & FLAG_ARCH_MASK, f"0x{self.flags & FLAG_ARCH_MASK:04x}")


@record(frozen=True)
class LdCacheFile:
    """A cache as read: its entries in file order, the glibc-hwcaps subdirectory names
    its hwcap-extension entries index, the generator string, and ``problem``: why it
    cannot be written back as read (None when it can)."""

    entries: list
    hwcaps: tuple = ()
    generator: bytes | None = None
    problem: str | None = None


def parse_ld_cache(data: bytes) -> list[LdCacheEntry]:
    """The libc6 entries of an ld.so.cache image, in file order (the lookup order ld.so
    uses)."""
    found = []
    for flags, key, value, _osv, _hwcap in read_ld_cache(data).entries:
        if (flags & FLAG_TYPE_MASK) == FLAG_ELF_LIBC6:
            found.append(LdCacheEntry(text(key), text(value), flags))
    return found


def text(raw: bytes) -> str:
    """A cache string as ``str`` (bytes that are not UTF-8 kept as surrogates)."""
    return raw.decode("utf-8", "surrogateescape")


def read_ld_cache(data: bytes) -> LdCacheFile:
    """Every entry of an ld.so.cache image, and its extension sections; raises
    LdCacheError for what is not a cache."""
    offset = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < 16:
            raise LdCacheError("truncated old-format header")
        (old_n,) = struct.unpack_from("<I", data, 12)
        offset = 16 + old_n * _OLD_ENTRY_SIZE
        offset = (offset + 7) & ~7
        if not data.startswith(NEW_MAGIC, offset):
            raise LdCacheError("old-format cache without the new table is not supported")
    elif not data.startswith(NEW_MAGIC):
        raise LdCacheError("not an ld.so.cache file (bad magic)")
    if len(data) < offset + _NEW_HEADER.size:
        raise LdCacheError("truncated header")
    _, nlibs, _len_strings, flags, ext = _NEW_HEADER.unpack_from(data, offset)
    start = offset + _NEW_HEADER.size
    end = start + nlibs * _NEW_ENTRY.size
    if end > len(data):
        raise LdCacheError(f"header claims {nlibs} entries, file too short")
    strings: dict[int, bytes] = {}

    def string(at: int) -> bytes:
        found = strings.get(at)
        if found is None:
            at += offset
            if not 0 <= at < len(data):
                raise LdCacheError(f"string offset {at} out of range")
            stop = data.find(b"\0", at)
            if stop < 0:
                raise LdCacheError("unterminated string")
            found = strings[at - offset] = data[at:stop]
        return found

    entries = [(f, string(k), string(v), o, h)
               for f, k, v, o, h in _NEW_ENTRY.iter_unpack(data[start:end])]  # fmt: skip
    problem = None
    if flags & 3 not in (0, ENDIAN_LITTLE) or sys.byteorder != "little":
        problem = "not a little-endian cache"
    hwcaps: tuple = ()
    generator = None
    if ext and problem is None:
        try:
            if offset:
                raise LdCacheError("extensions behind the old-format table")
            hwcaps, generator = _extensions(data, ext)
        except (LdCacheError, struct.error) as err:
            problem = f"extensions: {err}"
    return LdCacheFile(entries, hwcaps, generator, problem)


def _extensions(data: bytes, at: int) -> tuple[tuple[bytes, ...], bytes | None]:
    """(glibc-hwcaps names, generator) of the extension directory at ``at``; raises
    LdCacheError for a section this module does not know (it could not move it)."""
    if at % 4:
        raise LdCacheError("misaligned directory")
    magic, count = _EXT_HEADER.unpack_from(data, at)
    if magic != EXT_MAGIC or count > 16:
        raise LdCacheError("bad directory")
    hwcaps: tuple[bytes, ...] = ()
    generator = None
    for i in range(count):
        tag, flags, where, size = _EXT_SECTION.unpack_from(
            data, at + _EXT_HEADER.size + i * _EXT_SECTION.size
        )
        if where + size > len(data) or flags:
            raise LdCacheError(f"section {tag} out of range or flagged")
        if tag == TAG_GENERATOR:
            generator = data[where : where + size]
        elif tag == TAG_HWCAPS:
            if size % 4 or where % 4:
                raise LdCacheError("misaligned glibc-hwcaps section")
            names = []
            for (offset,) in struct.iter_unpack("<I", data[where : where + size]):
                stop = data.find(b"\0", offset)
                if offset >= len(data) or stop < 0:
                    raise LdCacheError("glibc-hwcaps name out of range")
                names.append(data[offset:stop])
            hwcaps = tuple(names)
        else:
            raise LdCacheError(f"unknown section {tag}")
    return hwcaps, generator


def order_key(name: bytes) -> tuple[tuple[int, int], ...]:
    """``name`` as glibc's ``_dl_cache_libcmp`` reads it, token by token: a byte as
    (0, byte), a digit run as (1, its number). Tuples of these compare as glibc compares
    the names (a number above any byte, a name above its own prefix). Raises
    LdCacheError where this cannot reproduce it: a byte over 0x7f (C's ``char`` is
    signed on some architectures) or a digit run over 9 digits (its C int overflows).
    Kept per name: a worker of nvshim-runtimed adds the same driver libraries create
    after create."""
    key = _KEYS.get(name)
    if key is not None:
        return key
    if not name.isascii():
        raise LdCacheError(f"{name!r}: a byte over 0x7f")
    tokens = []
    i, n = 0, len(name)
    while i < n:
        c = name[i]
        if 48 <= c <= 57:
            j = i + 1
            while j < n and 48 <= name[j] <= 57:
                j += 1
            if j - i > 9:
                raise LdCacheError(f"{name!r}: a digit run over 9 digits")
            tokens.append((1, int(name[i:j])))
            i = j
        else:
            tokens.append((0, c))
            i += 1
    if len(_KEYS) >= _KEYS_KEPT:  # the images' own names come and go
        _KEYS.clear()
    key = _KEYS[name] = tuple(tokens)
    return key


_KEYS: dict[bytes, tuple[tuple[int, int], ...]] = {}
_KEYS_KEPT = 4096


def with_entries(cache: LdCacheFile, added: list[RawEntry]) -> LdCacheFile:
    """``cache`` with ``added`` inserted where ldconfig's ``add_to_cache`` puts them
    (before the first entry whose key sorts below theirs). Raises LdCacheError when the
    cache cannot be written back as read, or when a key's order is not reproducible
    (``order_key``) or equals one already there: ldconfig's own rules decide between two
    libraries of one name."""
    if cache.problem:
        raise LdCacheError(cache.problem)
    entries = list(cache.entries)
    for entry in added:
        key = order_key(entry[1])
        lo, hi = 0, len(entries)
        while lo < hi:  # entries descend: find the first one below key
            mid = (lo + hi) // 2
            if key > order_key(entries[mid][1]):
                hi = mid
            else:
                lo = mid + 1
        if lo and key == order_key(entries[lo - 1][1]):
            raise LdCacheError(f"{entry[1]!r}: the cache has an entry of that name")
        entries.insert(lo, entry)
    return LdCacheFile(entries, cache.hwcaps, cache.generator)


def render_ld_cache(cache: LdCacheFile) -> bytes:
    """``cache`` in glibc's new format, as ldconfig lays it out: header, entries,
    string table, then (4-aligned) the extension directory, the glibc-hwcaps name
    offsets and the generator string."""
    count = len(cache.entries)
    base = _NEW_HEADER.size + count * _NEW_ENTRY.size
    table = bytearray()
    placed: dict[bytes, int] = {}

    def at(text: bytes) -> int:
        where = placed.get(text)
        if where is None:
            where = placed[text] = base + len(table)
            table.extend(text + b"\0")
        return where

    packed = []
    for flags, key, value, osv, hwcap in cache.entries:
        path = at(value)  # a key that ends its path shares its bytes, as ldconfig's do
        name = path + len(value) - len(key) if value.endswith(b"/" + key) else at(key)
        packed.append(_NEW_ENTRY.pack(flags, name, path, osv, hwcap))
    names = struct.pack(f"<{len(cache.hwcaps)}I", *(at(h) for h in cache.hwcaps))
    strings = bytes(table)
    ext = b""
    ext_at = 0
    if cache.hwcaps or cache.generator is not None:
        ext_at = (base + len(strings) + 3) & ~3
        n_sections = bool(cache.hwcaps) + (cache.generator is not None)
        data_at = ext_at + _EXT_HEADER.size + n_sections * _EXT_SECTION.size  # names, generator
        sections = []
        if cache.hwcaps:
            sections.append(_EXT_SECTION.pack(TAG_HWCAPS, 0, data_at, len(names)))
        if cache.generator is not None:
            where = data_at + len(names)
            sections.append(_EXT_SECTION.pack(TAG_GENERATOR, 0, where, len(cache.generator)))
        ext = b"".join((b"\0" * (ext_at - base - len(strings)),
                        _EXT_HEADER.pack(EXT_MAGIC, n_sections), *sections, names,
                        cache.generator or b""))  # fmt: skip
    header = _NEW_HEADER.pack(NEW_MAGIC, count, len(strings), ENDIAN_LITTLE, ext_at)
    return b"".join((header, *packed, strings, ext))
