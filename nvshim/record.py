"""Plain record classes for the per-container path: the subset of ``dataclasses`` nvshim
uses (fields with defaults or factories, ``frozen``, ``compare=False``, ``metadata``,
``replace``, ``asdict``, ``fields``), without its start-up cost.

``nvshim-runtime`` and ``nvshim-hook`` start a fresh interpreter for every container;
importing ``dataclasses`` pulls in ``inspect``, ``re`` and ``enum`` (about 9 ms, a third
of the time budget a GPU container may add). Here ``__init__`` is generated once per
class, as ``dataclasses`` does, so building a record costs the same; it is compiled on
the class's first call (about 0.15 ms each), so a record class a process never builds
costs nothing, and ``make`` builds one without it (nvshim.config's few, once per process).

Measured 2026-11-25 by ``bench/stand_ins.py`` (a 1-GPU ``create`` through
nvshim-runtime in its own process, no nvshim-runtimed, against the same runtime built on
``dataclasses``, interleaved, two runs of 30 rounds on the 2-core VM, yardstick
``python3 -IS -c pass`` 7.5 ms): 49.4 and 51.0 ms against 71.4 and 64.5 ms, +21.1 and
+16.1 ms median paired difference. nvshim-runtimed keeps its imports warm, but every
create it does not serve (none running, a decline) pays this. Kept: it saves far more
than 1 ms per GPU create.
"""

from __future__ import annotations

MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    """One field of a record: its name, default or factory, whether ``==`` uses it, and
    what its user attached (``metadata``, e.g. how nvshim.config reads it)."""

    __slots__ = ("name", "default", "default_factory", "compare", "metadata")

    def __init__(self, default=MISSING, default_factory=MISSING, compare=True, metadata=None):
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def field(*, default=MISSING, default_factory=MISSING, compare: bool = True, metadata=None):
    """A field with a ``default_factory`` (mutable defaults), excluded from ``==``, or
    carrying ``metadata``."""
    return Field(default, default_factory, compare, metadata)


def record(cls=None, *, frozen: bool = False):
    """Class decorator: ``__init__``, ``__repr__``, ``__eq__`` (and ``__hash__`` when
    ``frozen``) from the class's annotated fields, in order."""

    def wrap(cls):
        return _build(cls, frozen)

    return wrap if cls is None else wrap(cls)


def _build(cls, frozen: bool):
    specs: list[Field] = []
    for name in cls.__dict__.get("__annotations__", {}):
        value = cls.__dict__.get(name, MISSING)
        spec = value if isinstance(value, Field) else Field(default=value)
        spec.name = name
        if isinstance(value, Field):
            if spec.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, spec.default)
        if specs and spec.default is MISSING and spec.default_factory is MISSING:
            last = specs[-1]
            if last.default is not MISSING or last.default_factory is not MISSING:
                raise TypeError(f"{cls.__name__}: {name!r} without a default follows defaults")
        specs.append(spec)

    def __init__(self, *args, **kwargs):
        compile_init(cls)
        cls.__init__(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = __init__
    _uncompiled[cls] = (specs, frozen)
    cls.__record_fields__ = tuple(specs)
    compared = tuple(s.name for s in specs if s.compare)

    def key(self) -> tuple:
        return tuple(getattr(self, n) for n in compared)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return key(self) == key(other)

    def __repr__(self) -> str:
        inner = ", ".join(f"{s.name}={getattr(self, s.name)!r}" for s in specs)
        return f"{cls.__qualname__}({inner})"

    cls.__eq__ = __eq__
    cls.__repr__ = __repr__
    if frozen:
        cls.__hash__ = lambda self: hash(key(self))
        cls.__setattr__ = _refuse_set
        cls.__delattr__ = _refuse_set
    else:
        cls.__hash__ = None
    return cls


# the record classes whose ``__init__`` is still the stand-in that compiles it on first
# use: importing a module compiles nothing (a per-container process uses a few records)
_uncompiled: dict[type, tuple[list[Field], bool]] = {}


def compile_init(cls) -> None:
    """Give record class ``cls`` its generated ``__init__`` now (done already: nothing)."""
    pending = _uncompiled.pop(cls, None)
    if pending is not None:
        cls.__init__ = _compile_init(cls, *pending)


def compile_inits() -> None:
    """Compile every loaded record class's ``__init__``: nvshim-runtimed's parent, before
    it forks its workers (each would compile its own on first use)."""
    for cls in list(_uncompiled):
        compile_init(cls)


def _compile_init(cls, specs: list[Field], frozen: bool):
    """The class's ``__init__``, generated from its fields."""
    namespace: dict = {"MISSING": MISSING}
    params, body = [], []
    assign = "object.__setattr__(self, {0!r}, {0})" if frozen else "self.{0} = {0}"
    for spec in specs:
        if spec.default_factory is not MISSING:
            namespace[f"_factory_{spec.name}"] = spec.default_factory
            params.append(f"{spec.name}=MISSING")
            body.append(f"  if {spec.name} is MISSING: {spec.name} = _factory_{spec.name}()")
        elif spec.default is not MISSING:
            namespace[f"_default_{spec.name}"] = spec.default
            params.append(f"{spec.name}=_default_{spec.name}")
        else:
            params.append(spec.name)
        body.append("  " + assign.format(spec.name))
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["  pass"])
    exec(source, namespace)  # noqa: S102 - generated from the class's own field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _refuse_set(self, name, *value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def fields(obj_or_cls) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    return obj_or_cls.__record_fields__


def make(cls, values: dict):
    """A record of ``cls`` from ``values`` by field name, defaults for the others, without
    its ``__init__`` (nothing compiled): for the few records a process builds once."""
    obj = object.__new__(cls)
    state = obj.__dict__
    for spec in cls.__record_fields__:
        if spec.name in values:
            continue
        if spec.default_factory is not MISSING:
            state[spec.name] = spec.default_factory()
        elif spec.default is not MISSING:
            state[spec.name] = spec.default
        else:
            raise TypeError(f"{cls.__name__}: missing field {spec.name!r}")
    state.update(values)
    if len(state) != len(cls.__record_fields__):
        unknown = set(values) - {s.name for s in cls.__record_fields__}
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    return obj


def is_record(obj) -> bool:
    return hasattr(type(obj), "__record_fields__")


def replace(obj, **changes):
    """A copy of ``obj`` with ``changes`` applied (a new record; ``obj`` is unchanged)."""
    values = {s.name: getattr(obj, s.name) for s in fields(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    values.update(changes)
    return type(obj)(**values)


def asdict(obj):
    """``obj`` as plain data: records become dicts; lists, tuples and dicts are walked."""
    if is_record(obj):
        return {s.name: asdict(getattr(obj, s.name)) for s in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {asdict(k): asdict(v) for k, v in obj.items()}
    return obj
