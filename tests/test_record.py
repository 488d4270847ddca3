"""nvshim.record: the dataclasses subset the per-container path uses."""

from __future__ import annotations

import copy

import pytest

from nvshim.record import FrozenInstanceError, asdict, field, fields, record, replace


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
