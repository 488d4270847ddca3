"""nvshim.record: the dataclasses subset the per-container path uses."""

from __future__ import annotations

import copy

import pytest

from nvshim.record import FrozenInstanceError, asdict, field, fields, make, record, replace


@record(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    note: str = field(default="", compare=False)


@record
class Bag:
    name: str
    items: list[int] = field(default_factory=list)
    inner: Point | None = None


def test_init_defaults_factories_and_keywords():
    assert (Point(1).x, Point(1).y, Point(1, y=2).y) == (1, 0, 2)
    a, b = Bag("a"), Bag("b")
    a.items.append(1)
    assert b.items == []  # each instance gets its own list
    with pytest.raises(TypeError):
        Point()  # x is required
    with pytest.raises(TypeError):
        Point(1, z=3)


def test_equality_hash_and_compare_false():
    assert Point(1, 2, note="a") == Point(1, 2, note="b")
    assert Point(1, 2) != Point(1, 3)
    assert hash(Point(1, 2, note="a")) == hash(Point(1, 2))
    assert len({Point(1), Point(1), Point(2)}) == 2
    assert Point(1) != (1, 0, (), "")  # another type is never equal
    assert Bag("a") == Bag("a") and Bag.__hash__ is None  # mutable: unhashable


def test_frozen_refuses_assignment_but_copies_work():
    p = Point(1)
    with pytest.raises(FrozenInstanceError):
        p.x = 2
    with pytest.raises(AttributeError):
        del p.y
    assert copy.deepcopy(p) == p and copy.copy(p) == p


def test_replace_asdict_fields_and_repr():
    p = Point(1, 2, ("a",))
    q = replace(p, y=5)
    assert (p.y, q.y, q.tags) == (2, 5, ("a",))
    with pytest.raises(TypeError, match="no field 'z'"):
        replace(p, z=1)
    bag = Bag("b", [1], inner=p)
    assert asdict(bag) == {
        "name": "b",
        "items": [1],
        "inner": {"x": 1, "y": 2, "tags": ("a",), "note": ""},
    }
    assert [f.name for f in fields(Bag)] == ["name", "items", "inner"]
    assert repr(p) == "Point(x=1, y=2, tags=('a',), note='')"


def test_a_required_field_after_a_default_is_refused():
    with pytest.raises(TypeError, match="without a default follows"):

        @record
        class Bad:
            a: int = 1
            b: int


def test_make_builds_the_same_record_without_init():
    """``make`` (nvshim.config's few records, no ``__init__`` compiled): defaults and
    factories for the fields left out, the same equality and freezing; unknown or missing
    fields refused as ``__init__`` would."""

    @record(frozen=True)
    class Pair:
        a: int
        items: list[int] = field(default_factory=list, metadata="rules")

    made = make(Pair, {"a": 1})
    assert made == Pair(1) and made.items == [] and made.items is not make(Pair, {"a": 1}).items
    assert fields(Pair)[1].metadata == "rules" and fields(Pair)[0].metadata is None
    with pytest.raises(FrozenInstanceError):
        made.a = 2
    with pytest.raises(TypeError, match="no field 'b'"):
        make(Pair, {"a": 1, "b": 2})
    with pytest.raises(TypeError, match="missing field 'a'"):
        make(Pair, {})


def test_init_is_compiled_on_first_use():
    @record
    class Late:
        a: int = 1

    first = Late.__init__
    assert Late(a=2).a == 2 and Late.__init__ is not first  # replaced by the compiled one
    assert Late().a == 1 and Late.__init__.__qualname__.endswith("Late.__init__")


def test_compile_inits_leaves_nothing_to_compile_after_a_fork(monkeypatch):
    """nvshim-runtimed's parent compiles every record's ``__init__`` before it forks its
    workers: none is compiled on first use afterwards, and each builds what it did."""
    import nvshim.record as module

    @record(frozen=True)
    class Early:
        a: int
        b: list = field(default_factory=list)

    stand_in = Early.__init__
    module.compile_inits()
    assert Early.__init__ is not stand_in
    monkeypatch.setattr(module, "_compile_init", lambda *a: pytest.fail(f"compiled {a[0]}"))
    one = Early(1)
    assert (one.a, one.b, Early(2, [3]).b) == (1, [], [3]) and one.b is not Early(1).b
    with pytest.raises(FrozenInstanceError):
        one.a = 2
