"""JSON for the per-container path: the same C scanner and encoder the ``json`` module
uses, without importing ``json`` (its decoder and encoder compile regular expressions at
import, which pulls in ``re`` and ``enum``: about 6 ms per process).

``loads`` and ``dumps`` give the same results as ``json.loads`` and compact
``json.dumps(obj, separators=(",", ":"))``; errors are the same ``ValueError``s. Where
the interpreter has no ``_json`` accelerator, the ``json`` module is used instead.

Measured 2026-11-25 by ``bench/stand_ins.py`` (a 1-GPU ``create`` through
nvshim-runtime in its own process, no nvshim-runtimed, against the same runtime on
``json``, interleaved, two runs of 30 rounds on the 2-core VM, yardstick ``python3 -IS
-c pass`` 7.5 ms): 49.4 and 51.0 ms against 55.8 and 56.2 ms, +5.4 and +4.9 ms median
paired difference. nvshim-runtimed keeps its imports warm, but every create it does not
serve (none running, a decline) pays this. Kept: it saves more than 1 ms per GPU create.
"""

from __future__ import annotations

_WHITESPACE = " \t\n\r"

try:
    import _json

    _make_scanner = _json.make_scanner
    _make_encoder = _json.make_encoder
    _encode_string = _json.encode_basestring_ascii
except (ImportError, AttributeError):  # pragma: no cover - CPython always has _json
    _make_scanner = _make_encoder = _encode_string = None


class _Context:
    """What the C scanner reads from a decoder: the ``json.loads`` defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {
        "-Infinity": float("-inf"),
        "Infinity": float("inf"),
        "NaN": float("nan"),
    }.__getitem__


_scan = _make_scanner(_Context()) if _make_scanner else None


def _decode_error(message: str, text: str, pos: int) -> ValueError:
    from json import JSONDecodeError  # error path only

    return JSONDecodeError(message, text, pos)


def loads(data: str | bytes | bytearray):
    """Parse one JSON document (bytes must be UTF-8)."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:
        raise _decode_error("Expecting value", text, stop.value) from None
    except SystemError:
        # The C scanner raises json.decoder.JSONDecodeError only when json.decoder is
        # already imported; otherwise it fails this way. Only bad documents get here:
        # let the json module parse it again and raise the proper error.
        import json

        return json.loads(text)
    tail = text[end:]
    if tail.strip(_WHITESPACE):
        raise _decode_error("Extra data", text, end + len(tail) - len(tail.lstrip(_WHITESPACE)))
    return value


def _not_serializable(obj):
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def dumps(obj) -> str:
    """Compact JSON text (``separators=(",", ":")``, ASCII only), as ``json.dumps``."""
    if _make_encoder is None:  # pragma: no cover
        import json

        return json.dumps(obj, separators=(",", ":"))
    encode = _make_encoder(
        {}, _not_serializable, _encode_string, None, ":", ",", False, False, True
    )
    return "".join(encode(obj, 0))
