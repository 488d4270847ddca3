"""TOML documents edited with tomlkit, in the file's own style.

tomlkit keeps comments, blank lines, key order and quoting of everything it parsed; what it
does not do is lay out *new* items the way the file does. This module adds that: new keys
take the indentation of their sibling keys, a new table copies the header and key
indentation of a sibling table (``runtimes.runc`` for ``runtimes.nvshim``), and comments
that trail the previous table (which belong to whatever follows) stay below the new table.
After every change the text is parsed again, so each step is checked to be valid TOML.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import tomlkit
from tomlkit.container import Container, OutOfOrderTableProxy
from tomlkit.exceptions import ParseError, TOMLKitError
from tomlkit.items import AoT, Comment, InlineTable, Null, String, StringType, Table, Whitespace

from nvshim.engines.doc import MISSING, Document, Keys, dotted, same, type_name
from nvshim.errors import InputFileError, NvshimError

_TABLES = (Container, Table, OutOfOrderTableProxy, InlineTable)


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if unwrap is not None else value


def _is_table(node: Any) -> bool:
    return isinstance(node, _TABLES)


def _found(node: Any) -> str:
    if isinstance(node, AoT):
        return "an array of tables"
    if isinstance(node, InlineTable):
        return "an inline table"
    return type_name(_plain(node))


def _line_indent(indent: str) -> str:
    """The indentation on the header's own line (drop the blank lines before it)."""
    return indent.rsplit("\n", 1)[-1]


def _kv_items(container: Container) -> list[tuple[Any, Any]]:
    return [
        (k, v) for k, v in container.body if k is not None and not isinstance(v, (Table, AoT, Null))
    ]


def _child_tables(container: Container) -> list[tuple[Any, Table]]:
    return [(k, v) for k, v in container.body if k is not None and isinstance(v, Table)]


def _tail(container: Container) -> Container:
    """The container whose last items render last under ``container``."""
    body = [v for _, v in container.body if not isinstance(v, Null)]
    if body and isinstance(body[-1], Table):
        return _tail(body[-1].value)
    if body and isinstance(body[-1], AoT) and body[-1].body:
        return _tail(body[-1].body[-1].value)
    return container


def _peel(container: Container) -> list[Any]:
    """Detach the trailing blank lines and comments of ``container`` (they precede what
    comes next in the file, so they must stay in front of it)."""
    peeled: list[Any] = []
    body = container.body
    while body and body[-1][0] is None and isinstance(body[-1][1], (Whitespace, Comment, Null)):
        item = body.pop()[1]
        if not isinstance(item, Null):
            peeled.append(item)
    peeled.reverse()
    return peeled


def _renders_blank_line_first(items: list[Any]) -> bool:
    return bool(items) and isinstance(items[0], Whitespace) and items[0].s.startswith("\n")


class _Style:
    """Habits of a document: key indent under a header, header nesting step, blank lines
    before headers, and literal ('...') or basic ("...") strings."""

    def __init__(self, doc: Container, text: str) -> None:
        kv_steps: Counter[int] = Counter()
        nest_steps: Counter[int] = Counter()
        self.char = " "

        def walk(container: Container, anchor: str | None) -> None:
            for _, item in container.body:
                tables = [item] if isinstance(item, Table) else []
                if isinstance(item, AoT):
                    tables = list(item.body)
                for table in tables:
                    mine = anchor
                    if not table.is_super_table():
                        mine = _line_indent(table.trivia.indent)
                        if anchor is not None:
                            nest_steps[max(0, len(mine) - len(anchor))] += 1
                        kvs = _kv_items(table.value)
                        if kvs:
                            kv = kvs[0][1].trivia.indent
                            if "\t" in kv:
                                self.char = "\t"
                            kv_steps[max(0, len(_line_indent(kv)) - len(mine))] += 1
                    walk(table.value, mine)

        walk(doc, None)
        self.kv_step = kv_steps.most_common(1)[0][0] if kv_steps else 2
        self.nest_step = nest_steps.most_common(1)[0][0] if nest_steps else 0
        self.blank = _blank_before_headers(text)
        self.literal = len(re.findall(r"[=\[,]\s*'", text)) > len(re.findall(r'[=\[,]\s*"', text))

    def item(self, value: Any, literal: bool | None = None) -> Any:
        """A tomlkit item for ``value`` in the document's string style."""
        literal = self.literal if literal is None else literal
        if isinstance(value, str):
            plain = "'" not in value and "\n" not in value and value.isprintable()
            return tomlkit.string(value, literal=literal and plain)
        if isinstance(value, list):
            array = tomlkit.array()
            for member in value:
                array.append(self.item(member, literal))
            return array
        return tomlkit.item(value)

    def separator(self) -> str:
        """What goes before a new header: a blank line if the file uses them."""
        return "\n" if self.blank else ""

    def kv(self, header: str) -> str:
        return header + self.char * self.kv_step

    def nest(self, header: str) -> str:
        return header + self.char * self.nest_step


TEMPLATE_SUFFIX = ".tmpl"
TEMPLATE_MARK = "#nvshim-template-line:"


def _is_action(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith("{{") and stripped.endswith("}}")


def _split_template_head(text: str) -> tuple[str, str]:
    """The leading template action lines (and blank lines among them), and the rest."""
    lines = text.split("\n")
    n = 0
    while n < len(lines) - 1 and (_is_action(lines[n]) or not lines[n].strip()):
        n += 1
    if not any(_is_action(line) for line in lines[:n]):
        return "", text
    return "\n".join(lines[:n]) + "\n", "\n".join(lines[n:])


def _hide_template_lines(text: str) -> str:
    """Whole-line Go template actions (``{{ template "base" . }}``) as TOML comments."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _is_action(line):
            lines[i] = TEMPLATE_MARK + line
    return "\n".join(lines)


def _show_template_lines(text: str) -> str:
    return "\n".join(
        line.removeprefix(TEMPLATE_MARK) if line.startswith(TEMPLATE_MARK) else line
        for line in text.split("\n")
    )


class TomlDoc(Document):
    """A TOML file held as a tomlkit document."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        # Edit with "\n" line ends; a CRLF file gets CRLF back, new lines included.
        self.crlf = "\r\n" in text
        if self.crlf:
            text = text.replace("\r\n", "\n")
        self.template = path.endswith(TEMPLATE_SUFFIX)
        self.head = ""
        if self.template:  # k3s/RKE2 config.toml.tmpl: leading Go template lines kept aside,
            self.head, text = _split_template_head(text)  # later ones held as comments
            text = _hide_template_lines(text)
        self.original = text
        self.text = text
        self.doc = self._parse(text)

    def _parse(self, text: str) -> tomlkit.TOMLDocument:
        try:
            return tomlkit.parse(text)
        except ParseError as err:
            reason = re.sub(r" at line \d+ col \d+$", "", str(err))
            raise InputFileError(
                f"{self.path}:{err.line}: invalid TOML (column {err.col}): {reason}"
            ) from None
        except TOMLKitError as err:
            raise InputFileError(f"{self.path}: invalid TOML: {err}") from None

    def _reparse(self) -> None:
        text = self.doc.as_string()
        try:
            self.doc = tomlkit.parse(text)
        except TOMLKitError as err:  # a bug in the edit, never the user's input
            raise NvshimError(
                f"{self.path}: internal error: edit produced invalid TOML: {err}"
            ) from None
        self.text = text

    # -- reading ---------------------------------------------------------------------------

    def _walk(self, keys: Keys) -> Any:
        node: Any = self.doc
        for i, key in enumerate(keys):
            if not _is_table(node):
                raise self.type_error(keys[:i], "a table", _found(node))
            if key not in node:
                return MISSING
            node = node[key]
        return node

    def get(self, keys: Keys) -> Any:
        node = self._walk(keys)
        return node if node is MISSING else _plain(node)

    def render(self) -> bytes:
        text = self.doc.as_string()
        if self.template:
            text = self.head + _show_template_lines(text)
        return (text.replace("\n", "\r\n") if self.crlf else text).encode()

    def is_empty(self) -> bool:
        """A template holding only Go template lines is not empty: it renders a config."""
        if self.template and (self.head or TEMPLATE_MARK in self.original):
            return False
        return super().is_empty()

    # -- writing ---------------------------------------------------------------------------

    def set(self, keys: Keys, value: Any) -> list[Keys]:
        style = _Style(self.doc, self.text)
        parent_keys, leaf = keys[:-1], keys[-1]
        node: Any = self.doc
        depth = 0
        while depth < len(parent_keys):
            if not _is_table(node):
                raise self.type_error(parent_keys[:depth], "a table", _found(node))
            if parent_keys[depth] not in node:
                break
            node = node[parent_keys[depth]]
            depth += 1
        if not _is_table(node):
            raise self.type_error(parent_keys[:depth], "a table", _found(node))
        for n in range(1, depth + 1):
            if isinstance(self._walk(parent_keys[:n]), InlineTable):
                raise self._unsupported(parent_keys[:n], "it is an inline table")
        created: list[Keys] = []
        if depth < len(parent_keys):
            # Tables are missing: build them (outer ones header-less) holding the value.
            missing = parent_keys[depth:]
            tree: Any = {leaf: value}
            for key in reversed(missing[1:]):
                tree = {key: tree}
            supers = len(missing) - (0 if isinstance(value, dict) else 1)
            self._add_table(node, parent_keys[:depth], missing[0], tree, style, supers)
            created = [parent_keys[:n] for n in range(depth + 1, len(parent_keys) + 1)]
        elif isinstance(value, dict):
            if leaf in node:
                current = node[leaf]
                if not isinstance(current, Table):
                    raise self.type_error(keys, "a table", _found(current))
                self._replace_table(node, keys, value, style)
            else:
                self._add_table(node, parent_keys, leaf, value, style, 0)
        else:
            self._put_value(node, keys, value, style)
        self._reparse()
        if not same(self.get(keys), value):
            raise self._unsupported(keys[:-1], "its layout (dotted keys?) defeats an in-place edit")
        return created

    def _put_value(self, node: Any, keys: Keys, value: Any, style: _Style) -> None:
        leaf = keys[-1]
        if leaf in node:
            current = node[leaf]
            if _is_table(current) or isinstance(current, AoT):
                raise self.type_error(keys, type_name(value), _found(current))
            literal = isinstance(current, String) and current.type == StringType.SLL
            # tomlkit keeps the old item's indentation and comment
            node[leaf] = style.item(value, literal if isinstance(current, String) else None)
            return
        part = self._part_for_values(node, style)
        container = part if isinstance(part, Container) else part.value
        kvs = _kv_items(container)
        item = style.item(value)
        if kvs:
            item.trivia.indent = _line_indent(kvs[-1][1].trivia.indent)
            last = max(i for i, (k, _) in enumerate(container.body) if k == kvs[-1][0])
            at = last + 1
        else:
            header = "" if isinstance(part, Container) else _line_indent(part.trivia.indent)
            item.trivia.indent = "" if isinstance(part, Container) else style.kv(header)
            at = self._first_table_index(container)
        if at >= len(container.body):
            container.append(leaf, item)
            return
        container._insert_at(at, leaf, item)
        following = container.body[at + 1][1]
        if isinstance(part, Container) and at == 0 and not isinstance(following, Whitespace):
            item.trivia.trail = "\n\n"  # a blank line between a new first key and the rest

    @staticmethod
    def _first_table_index(container: Container) -> int:
        """Where a key goes in a table that has none: before the first sub-table and the
        blank lines and comments that lead up to it."""
        body = container.body
        idx = next((i for i, (_, v) in enumerate(body) if isinstance(v, (Table, AoT))), len(body))
        while idx > 0 and body[idx - 1][0] is None:
            if not isinstance(body[idx - 1][1], (Whitespace, Comment)):
                break
            idx -= 1
        return idx

    @staticmethod
    def _part_for_values(node: Any, style: _Style) -> Any:
        """The concrete table a new plain key should go into (a header-less table gets its
        header, and the blank line before its first sub-table moves up in front of it)."""
        if isinstance(node, OutOfOrderTableProxy):
            parts = node._tables
            for part in parts:
                if _kv_items(part.value):
                    return part
            for part in parts:
                if not part.is_super_table():
                    return part
            node = parts[0]
        if isinstance(node, Table) and node.is_super_table():
            node._is_super_table = False
            children = _child_tables(node.value)
            if children and style.blank and "\n" not in children[0][1].trivia.indent:
                children[0][1].trivia.indent = "\n" + children[0][1].trivia.indent
        return node

    @staticmethod
    def _part_for_tables(node: Any) -> Any:
        """The concrete table a new sub-table should go into (the part holding sub-tables)."""
        if isinstance(node, OutOfOrderTableProxy):
            parts = node._tables
            with_tables = [p for p in parts if _child_tables(p.value)]
            return (with_tables or parts)[-1]
        return node

    def _build(
        self,
        value: dict,
        header: str,
        kv: str,
        sample: Table | None,
        style: _Style,
        supers: int,
    ) -> Table:
        """A new table for ``value``: header indent ``header``, keys at ``kv``; sub-tables
        copy ``sample``'s layout where it has the same sub-table. The first ``supers``
        levels are header-less (implicit) tables."""
        table = tomlkit.table(is_super_table=supers > 0)
        table.trivia.indent = "" if supers > 0 else header
        for key, sub in value.items():
            if isinstance(sub, dict):
                continue
            item = style.item(sub)
            item.trivia.indent = kv
            table.raw_append(key, item)
        for key, sub in value.items():
            if not isinstance(sub, dict):
                continue
            sub_sample = None
            if sample is not None and isinstance(sample.get(key), Table):
                sub_sample = sample[key]
            if supers > 0:
                sub_header, sub_kv = header, kv
            elif sub_sample is not None and not sub_sample.is_super_table():
                sub_header = _line_indent(sub_sample.trivia.indent)
                sub_kvs = _kv_items(sub_sample.value)
                sub_kv = (
                    _line_indent(sub_kvs[0][1].trivia.indent) if sub_kvs else style.kv(sub_header)
                )
            else:
                sub_header = style.nest(_line_indent(header))
                sub_kv = style.kv(sub_header)
            child = self._build(sub, sub_header, sub_kv, sub_sample, style, max(0, supers - 1))
            if supers <= 0 and not child.is_super_table():
                blank = style.separator()
                if sub_sample is not None and sample is not None:
                    blank = "\n" if _blank_before(sample.value, sub_sample) else ""
                child.trivia.indent = blank + _line_indent(child.trivia.indent)
            table.raw_append(key, child)
        return table

    def _layout_for(self, part: Any, style: _Style, value: dict) -> tuple[str, str, Table | None]:
        """Header indent, key indent and sample table for a new child ``value`` of ``part``:
        the last sibling with the same sub-tables (else the last sibling) sets the layout."""
        siblings = [
            t
            for _, t in _child_tables(part if isinstance(part, Container) else part.value)
            if not t.is_super_table()
        ]
        subtables = {k for k, v in value.items() if isinstance(v, dict)}
        alike = [t for t in siblings if subtables <= {k for k, _ in _child_tables(t.value)}]
        for sibling in reversed(alike or siblings):
            header = _line_indent(sibling.trivia.indent)
            kvs = _kv_items(sibling.value)
            kv = _line_indent(kvs[0][1].trivia.indent) if kvs else style.kv(header)
            return header, kv, sibling
        if isinstance(part, Container):
            header = ""
        elif part.is_super_table():
            header = _line_indent(part.trivia.indent)
        else:
            header = style.nest(_line_indent(part.trivia.indent))
        return header, style.kv(header), None

    def _add_table(
        self, node: Any, parent_keys: Keys, key: str, value: dict, style: _Style, supers: int
    ) -> None:
        part = node if isinstance(node, Container) else self._part_for_tables(node)
        container = part if isinstance(part, Container) else part.value
        header, kv, sample = self._layout_for(part, style, value)
        if supers > 0:
            sample = None
        table = self._build(value, header, kv, sample, style, supers)
        peeled = _peel(_tail(container))
        first = _first_concrete(table)
        if self._renders_something(container, part):
            first.trivia.indent = style.separator() + _line_indent(first.trivia.indent)
        if isinstance(part, Container):
            part.append(key, table)
        else:
            part.raw_append(key, table)
        _clear_super_indents(table)  # tomlkit renders a lone "\n" indent even without a header
        if peeled:
            tail = _tail(table.value)
            if style.blank and not _renders_blank_line_first(peeled):
                tail.append(None, Whitespace("\n"))
            for item in peeled:
                tail.append(None, item)

    @staticmethod
    def _renders_something(container: Container, part: Any) -> bool:
        if not isinstance(part, Container):
            return True  # at least the parent's header or a sibling precedes it
        return any(not isinstance(v, Null) for _, v in container.body)

    def _replace_table(self, node: Any, keys: Keys, value: dict, style: _Style) -> None:
        old = node[keys[-1]]
        header = old.trivia.indent
        kvs = _kv_items(old.value)
        kv = _line_indent(kvs[0][1].trivia.indent) if kvs else style.kv(_line_indent(header))
        peeled = _peel(_tail(old.value))
        table = self._build(value, header, kv, old, style, 0)
        node[keys[-1]] = table
        if peeled:
            tail = _tail(table.value)
            for item in peeled:
                tail.append(None, item)

    def delete(self, keys: Keys) -> None:
        parent = self._walk(keys[:-1])
        if parent is MISSING or not _is_table(parent) or keys[-1] not in parent:
            return
        current = parent[keys[-1]]
        if isinstance(current, Table):
            self._delete_table(parent, keys[-1], current)
        else:
            del parent[keys[-1]]
        self._reparse()

    def _delete_table(self, parent: Any, key: str, table: Table) -> None:
        peeled = _peel(_tail(table.value))
        owner = parent
        if isinstance(parent, OutOfOrderTableProxy):
            owner = next(p for p in parent._tables if key in p)
        container = owner if isinstance(owner, Container) else owner.value
        position = next(i for i, (_, v) in enumerate(container.body) if v is table)
        previous = [v for _, v in container.body[:position] if isinstance(v, (Table, AoT))]
        del owner[key]
        # They go back under the table before it (or at the end of the parent's own keys).
        if previous and isinstance(previous[-1], Table):
            home = _tail(previous[-1].value)
        else:
            home = container
        # The blank line that led up to the removed header goes with it.
        while home.body and home.body[-1][0] is None:
            if not isinstance(home.body[-1][1], (Whitespace, Null)):
                break
            home.body.pop()
        for item in peeled:
            home.append(None, item)

    def list_add(self, keys: Keys, item: Any) -> None:
        array = self._walk(keys)
        if not isinstance(_plain(array), list):
            raise self.type_error(keys, "an array", _found(array))
        array.append(item)
        self._reparse()

    def list_remove(self, keys: Keys, item: Any) -> None:
        array = self._walk(keys)
        if array is MISSING or not isinstance(_plain(array), list):
            return
        for index in reversed(range(len(array))):
            if same(_plain(array[index]), item):
                del array[index]
        self._reparse()

    # -- locating keys for error messages --------------------------------------------------

    def line_of(self, keys: Keys) -> int | None:
        return find_line(self.original, keys) or find_line(self.text, keys)

    def _unsupported(self, keys: Keys, why: str) -> InputFileError:
        line = self.line_of(keys)
        where = f"{self.path}:{line}" if line else self.path
        return InputFileError(
            f"{where}: cannot add to {dotted(keys)}: {why}; write it as a [table] section"
        )


def _blank_before(container: Container, table: Table) -> bool:
    """Whether a blank line precedes ``table``'s header inside ``container``."""
    if "\n" in table.trivia.indent:
        return True
    body = [v for _, v in container.body if not isinstance(v, Null)]
    at = next(i for i, v in enumerate(body) if v is table)
    return at > 0 and isinstance(body[at - 1], Whitespace) and "\n" in body[at - 1].s


def _clear_super_indents(table: Table) -> None:
    while table.is_super_table():
        table.trivia.indent = ""
        table = next(v for _, v in table.value.body if isinstance(v, Table))


def _first_concrete(table: Table) -> Table:
    """The first table of a built chain that renders a header."""
    while table.is_super_table():
        table = next(v for _, v in table.value.body if isinstance(v, Table))
    return table


_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER_RE = re.compile(rf"^\s*\[\[?\s*({_KEY})\s*\]\]?\s*(?:#.*)?$")
_KEYLINE_RE = re.compile(rf"^\s*({_KEY})\s*=(.*)$")


def _key_chain(key_text: str) -> Keys | None:
    try:
        tree = tomlkit.parse(key_text + " = 0").unwrap()
    except TOMLKitError:
        return None
    chain: list[str] = []
    while isinstance(tree, dict) and len(tree) == 1:
        key = next(iter(tree))
        chain.append(key)
        tree = tree[key]
    return tuple(chain)


def find_line(text: str, keys: Keys) -> int | None:
    """Best-effort 1-based line where ``keys`` (a table or a key) is defined in ``text``."""
    header: Keys = ()
    open_string: str | None = None
    depth = 0
    for number, line in enumerate(text.splitlines(), 1):
        if open_string:
            if open_string in line:
                open_string = None
            continue
        if depth > 0:
            depth += line.count("[") - line.count("]")
            continue
        match = _HEADER_RE.match(line)
        if match:
            header = _key_chain(match.group(1)) or header
            if header[: len(keys)] == keys and keys:
                return number
            continue
        match = _KEYLINE_RE.match(line)
        if not match:
            continue
        chain = _key_chain(match.group(1))
        if chain is not None and (header + chain)[: len(keys)] == keys and keys:
            return number
        rest = match.group(2).strip()
        for quote in ('"""', "'''"):
            if rest.startswith(quote) and rest.count(quote) == 1:
                open_string = quote
        if rest.startswith("["):
            depth = rest.count("[") - rest.count("]")
    return None


def _blank_before_headers(text: str) -> bool:
    """Whether most headers (after the first) follow a blank line (comments skipped)."""
    lines = text.splitlines()
    votes = Counter()
    seen_header = False
    for number, line in enumerate(lines):
        if not _HEADER_RE.match(line):
            continue
        if seen_header:
            before = number - 1
            while before >= 0 and lines[before].lstrip().startswith("#"):
                before -= 1
            votes[before >= 0 and not lines[before].strip()] += 1
        seen_header = True
    return votes[True] >= votes[False]
