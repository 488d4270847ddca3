"""Parser for glibc's binary ``/etc/ld.so.cache`` (``glibc-ld.so.cache1.1``, optionally
behind the old ``ld.so-1.7.0`` table). Standard library only: the hook imports it."""

from __future__ import annotations

import struct

from nvshim.record import record

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, ext
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_OLD_ENTRY_SIZE = 12

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
ARCH_FLAGS = {
    0x0300: "x86_64",
    0x0800: "x32",
    0x0A00: "aarch64",
    0x0000: "32bit",
}


class LdCacheError(ValueError):
    """The data is not a cache this parser understands."""


@record(frozen=True)
class LdCacheEntry:
    """One library in the cache: ``name`` is the SONAME-like key, ``path`` its file."""

    name: str
    path: str
    flags: int

    @property
    def arch(self) -> str:
        return ARCH_FLAGS.get(self.flags & FLAG_ARCH_MASK, f"0x{self.flags & FLAG_ARCH_MASK:04x}")


def parse_ld_cache(data: bytes) -> list[LdCacheEntry]:
    """Entries of an ld.so.cache image, in file order (the lookup order ld.so uses)."""
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
    _, nlibs, _len_strings, _flags, _ext = _NEW_HEADER.unpack_from(data, offset)
    base = offset
    start = offset + _NEW_HEADER.size
    if start + nlibs * _NEW_ENTRY.size > len(data):
        raise LdCacheError(f"header claims {nlibs} entries, file too short")
    entries = []
    for i in range(nlibs):
        flags, key, value, _osv, _hwcap = _NEW_ENTRY.unpack_from(data, start + i * _NEW_ENTRY.size)
        if (flags & FLAG_TYPE_MASK) != FLAG_ELF_LIBC6:
            continue
        entries.append(LdCacheEntry(_cstr(data, base + key), _cstr(data, base + value), flags))
    return entries


def _cstr(data: bytes, at: int) -> str:
    if not 0 <= at < len(data):
        raise LdCacheError(f"string offset {at} out of range")
    end = data.find(b"\0", at)
    if end < 0:
        raise LdCacheError("unterminated string")
    return data[at:end].decode("utf-8", "surrogateescape")
