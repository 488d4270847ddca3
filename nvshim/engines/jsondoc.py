"""JSON documents (Docker's ``daemon.json``): key order and indentation kept.

JSON has no comments, so the file is written back with ``json.dumps`` using the file's own
indentation (spaces or tabs, as found; one line stays one line). Keys keep their order;
new keys go last. Errors name the line of the offending key.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nvshim.engines.doc import MISSING, Document, Keys, type_name
from nvshim.errors import InputFileError

DEFAULT_INDENT = "    "
_INDENT_RE = re.compile(r"^([ \t]+)\S", re.MULTILINE)


def _json_words(text: str) -> str:
    return text.replace("a table", "an object")


class JsonDoc(Document):
    """A JSON object file."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.text = text
        self.final_newline = text.endswith("\n") or not text.strip()
        if not text.strip():
            self.data: dict[str, Any] = {}
            self.indent = DEFAULT_INDENT
            self.inline: set[tuple] = set()
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputFileError(
                f"{path}:{err.lineno}: invalid JSON (column {err.colno}): {err.msg}"
            ) from None
        if not isinstance(data, dict):
            raise InputFileError(f"{path}:1: must be a JSON object, found {type_name(data)}")
        self.data = data
        match = _INDENT_RE.search(text)
        self.indent = match.group(1) if match else DEFAULT_INDENT
        self.inline = _one_line_containers(text)
        if not data:
            self.inline.discard(())

    def type_error(self, keys: Keys, want: str, found: Any) -> Exception:
        return super().type_error(keys, _json_words(want), _json_words(found))

    def key_name(self, keys: Keys) -> str:
        return ".".join(keys) or "the top level"

    def _walk(self, keys: Keys) -> Any:
        node: Any = self.data
        for i, key in enumerate(keys):
            if not isinstance(node, dict):
                raise self.type_error(keys[:i], "an object", type_name(node))
            if key not in node:
                return MISSING
            node = node[key]
        return node

    def get(self, keys: Keys) -> Any:
        node = self._walk(keys)
        return json.loads(json.dumps(node)) if node is not MISSING else MISSING

    def set(self, keys: Keys, value: Any) -> list[Keys]:
        node = self.data
        created: list[Keys] = []
        for i, key in enumerate(keys[:-1]):
            if key not in node:
                node[key] = {}
                created.append(keys[: i + 1])
            node = node[key]
            if not isinstance(node, dict):
                raise self.type_error(keys[: i + 1], "an object", type_name(node))
        leaf = keys[-1]
        if leaf in node:
            current = node[leaf]
            if isinstance(current, dict) != isinstance(value, dict):
                raise self.type_error(keys, type_name(value), type_name(current))
        node[leaf] = json.loads(json.dumps(value))
        return created

    def delete(self, keys: Keys) -> None:
        parent = self._walk(keys[:-1])
        if isinstance(parent, dict):
            parent.pop(keys[-1], None)

    def list_add(self, keys: Keys, item: Any) -> None:
        array = self._walk(keys)
        if not isinstance(array, list):
            raise self.type_error(keys, "an array", type_name(array))
        array.append(item)

    def list_remove(self, keys: Keys, item: Any) -> None:
        array = self._walk(keys)
        if isinstance(array, list):
            array[:] = [x for x in array if x != item]

    def render(self) -> bytes:
        text = self._dump(self.data, (), 0)
        return (text + ("\n" if self.final_newline else "")).encode()

    def _dump(self, value: Any, path: tuple, level: int) -> str:
        """JSON for ``value``: containers that were on one line stay on one line."""
        if not isinstance(value, (dict, list)) or not value or path in self.inline:
            return json.dumps(value, ensure_ascii=False)
        inner = self.indent * (level + 1)
        if isinstance(value, dict):
            parts = []
            for key, item in value.items():
                name = json.dumps(key, ensure_ascii=False)
                parts.append(f"{inner}{name}: {self._dump(item, (*path, key), level + 1)}")
            opening, closing = "{", "}"
        else:
            parts = [f"{inner}{self._dump(v, (*path, i), level + 1)}" for i, v in enumerate(value)]
            opening, closing = "[", "]"
        return opening + "\n" + ",\n".join(parts) + "\n" + self.indent * level + closing

    def line_of(self, keys: Keys) -> int | None:
        pos = _key_position(self.text, keys)
        return None if pos is None else self.text.count("\n", 0, pos) + 1


def _key_position(text: str, keys: Keys) -> int | None:
    """Offset of the (first) member name ``keys`` in ``text``, walking the JSON itself."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n]*")

    def skip(i: int) -> int:
        return ws.match(text, i).end()

    try:
        i = skip(0)
        for depth, key in enumerate(keys):
            if text[i] != "{":
                return None
            i = skip(i + 1)
            while text[i] != "}":
                start = i
                name, i = json.decoder.scanstring(text, i + 1)
                i = skip(skip(i) + 1)  # past the colon
                if name == key:
                    if depth == len(keys) - 1:
                        return start
                    break
                _, i = decoder.raw_decode(text, i)
                i = skip(i)
                if text[i] == ",":
                    i = skip(i + 1)
            else:
                return None
    except (IndexError, ValueError):
        return None
    return None


def _one_line_containers(text: str) -> set[tuple]:
    """Paths of the objects and arrays written on a single line in ``text``."""
    found: set[tuple] = set()
    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n]*")

    def skip(i: int) -> int:
        return ws.match(text, i).end()

    def walk(i: int, path: tuple) -> int:
        i = skip(i)
        start = i
        if text[i] == "{":
            i = skip(i + 1)
            while text[i] != "}":
                key, i = json.decoder.scanstring(text, i + 1)
                i = walk(skip(i) + 1, (*path, key))
                i = skip(i)
                if text[i] == ",":
                    i = skip(i + 1)
        elif text[i] == "[":
            i = skip(i + 1)
            index = 0
            while text[i] != "]":
                i = skip(walk(i, (*path, index)))
                index += 1
                if text[i] == ",":
                    i = skip(i + 1)
        else:
            return decoder.raw_decode(text, i)[1]
        if "\n" not in text[start : i + 1]:
            found.add(path)
        return i + 1

    try:
        walk(0, ())
    except (IndexError, ValueError):
        return set()
    return found
