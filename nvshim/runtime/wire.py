"""The messages between ``nvshim-runtime`` (``nvshim.runtime.client``) and
``nvshim-runtimed`` (``nvshim.runtimed``), one per ``SOCK_SEQPACKET`` packet: NUL
separated byte fields, the first a tag. No field can hold a NUL: they are argv
entries, environment entries, paths and numbers. Built-in modules only: the client
imports this for every GPU create.

client -> daemon  ``REQUEST`` protocol version nvshim-file argc program argv... env...
                  with SCM_RIGHTS: its stdin, stdout, stderr and working directory
daemon -> client  ``EXEC`` n fd-numbers... runtime argv...: exec it (the call is the
                  runtime's now), with SCM_RIGHTS: the n fds argv names, to be placed
                  at those numbers first (a process file for ``exec``)
                  ``SPAWN`` runtime argc argv... cleanup...: run it, answer ``STATUS``
                  ``EXIT`` code: exit with it
                  ``DECLINE`` why: do the call in-process, as without a daemon
client -> daemon  ``STATUS`` code: what the spawned runtime exited with
"""

# no `from __future__ import annotations`: loading __future__ costs 0.1 ms per GPU create
PROTOCOL = b"1"
REQUEST, EXEC, SPAWN, EXIT, DECLINE, STATUS = b"req", b"x", b"s", b"e", b"f", b"st"
LIMIT = 1 << 20  # bytes a packet may hold; more (a huge environment) goes in-process
FDS = 4  # stdin, stdout, stderr, working directory


def encode(text: str) -> bytes:
    """``text`` as the OS had it (argv and paths decode with surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def pack(tag: bytes, *fields: bytes) -> bytes:
    return b"\0".join((tag, *fields))


def unpack(packet: bytes) -> list[bytes]:
    return packet.split(b"\0")


def counted(items: list[bytes]) -> list[bytes]:
    """``items`` behind their count, so a list can precede other fields."""
    return [str(len(items)).encode(), *items]


def split_counted(fields: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The counted list at the start of ``fields``, and the fields after it. Raises
    ValueError for a bad count."""
    if not fields or not fields[0].isdigit() or int(fields[0]) > len(fields) - 1:
        raise ValueError("bad count")
    n = int(fields[0])
    return fields[1 : n + 1], fields[n + 1 :]
