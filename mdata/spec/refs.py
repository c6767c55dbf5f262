"""References to importable objects: how a plan spec names a transform, a cost model or a policy.

A spec is plain data (what msgpack, JSON and YAML carry), so code travels by *name*::

    {"type": "mdata.sources.transforms:TokenizeText", "args": {"field": "text"}}   # an instance
    {"type": "my_costs:step_cost"}                                                 # the object itself

``type`` is ``module:qualified.name``. With ``args`` (possibly ``{}``) the named object is called
with those keyword arguments (nested references inside them are resolved first); without ``args``
the reference stands for the object itself (a plain function cost model).

:func:`encode` describes an object: a frozen dataclass by its fields, any other class by its
constructor's parameters read back from the attributes of the same name (``names`` given to
``__init__`` stored as ``self.names``), or by its own ``spec_args()`` when it defines one. A
``*args`` parameter is read from the attribute of its name and passed positionally again.

Who may import what is a :class:`Trust`: in the process that wrote the plan (a driver, a
notebook, the ``mdata`` CLI) anything importable; on the scheduler only mdata's built-in cost
models and the objects of modules its operator listed (see :func:`scheduler_trust` and
docs/plan-files.md), so a client's code never runs inside the scheduler.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mdata.errors import MdataError, PlanError

__all__ = ["BUILTIN_REFERENCES", "Trust", "check_plain", "encode", "import_path", "is_reference",
           "resolve", "scheduler_trust"]

#: What the scheduler resolves without any configuration: mdata's own cost models.
BUILTIN_REFERENCES = frozenset({
    "mdata.cost:AttentionCost", "mdata.cost:ImagePatchCost", "mdata.cost:CombinedCost",
    "mdata.cost:VideoCost", "mdata.module_cost:ModuleCost",
})

_PLAIN = (str, int, float, bool, type(None))


class Trust:
    """Which references a process may import while reading a spec.

    ``modules=None`` trusts everything importable (the writer's own process). Otherwise a reference
    is imported only when it is one of :data:`BUILTIN_REFERENCES` or names an object *defined* in
    one of ``modules`` (or below them): a re-exported name (``trusted_mod:os``) does not count,
    since the object's own ``__module__`` and ``__qualname__`` must match the reference.
    """

    def __init__(self, modules: Iterable[str] | None = None, *, where: str = "",
                 builtins: Iterable[str] = BUILTIN_REFERENCES,
                 refuse: Callable[[str, str, str], Exception] | None = None) -> None:
        self.modules = None if modules is None else tuple(str(m) for m in modules)
        self.where = where
        self.builtins = frozenset(builtins)
        # refuse(path, what, reason) -> the error to raise instead of the scheduler's PlanError
        # (a loader worker names the source and the field: mdata.spec.worker_trust)
        self.refuse = refuse

    def _in_modules(self, module: str) -> bool:
        return self.modules is None or any(
            module == m or module.startswith(m + ".") for m in self.modules)

    def check(self, path: str, what: str) -> None:
        """Raise PlanError (or what ``refuse`` builds) unless ``path`` may be imported here
        (before importing anything)."""
        if self.modules is None or path in self.builtins:
            return
        if not self._in_modules(path.partition(":")[0]):
            if self.refuse is not None:
                raise self.refuse(path, what, "is not in a trusted module")
            trusted = ", ".join(self.modules) or "none"
            raise PlanError(
                f"{what} {path!r} is not imported {self.where or 'here'}: the scheduler never "
                "imports a client's code, only mdata's built-in cost models and mixtures and the "
                f"modules its operator trusts (mdata.planner.trusted-modules: {trusted}). Express "
                "it with mdata.cost's models (CombinedCost of AttentionCost / ImagePatchCost) or a "
                "built-in mixture, or have the module installed on the scheduler and trusted there"
            )

    def check_object(self, obj: Any, path: str, what: str) -> None:
        """After import: the object must be defined where the reference says (no re-exports)."""
        if self.modules is None or path in self.builtins:
            return
        module, _, name = path.partition(":")
        if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != name:
            if self.refuse is not None:
                raise self.refuse(path, what, f"names {obj!r:.80}, which is not defined in {module!r}")
            raise PlanError(
                f"{what} {path!r} names {obj!r}, which is not defined in {module!r}; the scheduler "
                "imports only objects defined in the modules it trusts"
            )


def import_path(obj: Any, what: str = "object") -> str:
    """``module:qualname`` of a class or function that another process can import by name."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        raise PlanError(f"{what} {obj!r} has no importable name; use a module-level class or function")
    if "<locals>" in name or "<lambda>" in name:
        raise PlanError(
            f"{what} {module}.{name} is defined inside a function (or is a lambda): another process "
            "cannot import it; define it at the top level of a module"
        )
    if module == "__main__":
        raise PlanError(
            f"{what} {name} is defined in __main__ (a script or notebook): other processes cannot "
            "import it; move it into a module on the workers' (and your) Python path"
        )
    return f"{module}:{name}"


def is_reference(value: Any) -> bool:
    """True for a dict that names an importable object (``type`` with a ``:`` and maybe ``args``)."""
    return (isinstance(value, Mapping) and "type" in value and set(value) <= {"type", "args"}
            and isinstance(value["type"], str) and ":" in value["type"])


def check_plain(value: Any, where: str) -> None:
    """Raise PlanError unless ``value`` is data msgpack, JSON and YAML all carry unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{where} is {value!r}; a plan spec holds finite numbers only")
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PlanError(f"{where} has key {key!r}; a plan spec's keys are strings")
            check_plain(item, f"{where}.{key}")
        return
    raise PlanError(f"{where} is a {type(value).__name__} ({value!r:.80}), not plain data")


# -- encoding ------------------------------------------------------------------------------------
def encode(value: Any, where: str) -> Any:
    """``value`` as plain data: scalars, lists and dicts as they are, objects as references."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{where} is {value!r}; a plan spec holds finite numbers only")
    if isinstance(value, _PLAIN):
        return value
    if hasattr(value, "dtype") and hasattr(value, "item"):
        if getattr(value, "ndim", 1) == 0:
            return encode(value.item(), where)  # a numpy scalar
        raise PlanError(f"{where} is an array of shape {getattr(value, 'shape', '?')}; a plan spec "
                        "holds lists: keep constructor arguments as lists (or tuples)")
    if isinstance(value, (list, tuple)):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PlanError(f"{where} has key {key!r}; a plan spec's keys are strings")
            out[key] = encode(item, f"{where}.{key}")
        return out
    if inspect.isfunction(value) or inspect.isbuiltin(value) or isinstance(value, type):
        return {"type": import_path(value, where)}
    path = import_path(type(value), where)
    return {"type": path, "args": encode(constructor_args(value, where), f"{where}.args")}


def constructor_args(obj: Any, where: str) -> dict[str, Any]:
    """The keyword arguments that rebuild ``obj`` (see the module docstring)."""
    spec_args = getattr(obj, "spec_args", None)
    if callable(spec_args):
        args = spec_args()
        if not isinstance(args, Mapping):
            raise PlanError(f"{where}: {type(obj).__name__}.spec_args() returned {args!r}, not a dict")
        return dict(args)
    try:
        params = list(inspect.signature(type(obj)).parameters.values())
    except (TypeError, ValueError):
        raise PlanError(f"{where}: cannot read the constructor of {type(obj).__name__}; define "
                        "spec_args() returning the keyword arguments that rebuild it") from None
    args: dict[str, Any] = {}
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            continue
        if not hasattr(obj, p.name):
            raise PlanError(
                f"{where}: cannot describe {type(obj).__name__} as data: its constructor argument "
                f"{p.name!r} is not an attribute of the same name. Make it a frozen dataclass, "
                "store each constructor argument under its name, or define spec_args() returning "
                "the keyword arguments that rebuild it"
            )
        args[p.name] = getattr(obj, p.name)
    return args


# -- resolving -----------------------------------------------------------------------------------
def _import(path: str, what: str) -> Any:
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        raise PlanError(f"{what} {path!r} is not a reference of the form 'package.module:Name'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"cannot import {what} {path!r}: {type(exc).__name__}: {exc}") from None
    return obj


def resolve(value: Any, trust: Trust, what: str) -> Any:
    """Plain data back to objects: references imported (under ``trust``) and called with their
    arguments, lists and dicts resolved item by item, scalars as they are."""
    if is_reference(value):
        path = value["type"]
        trust.check(path, what)
        target = _import(path, what)
        trust.check_object(target, path, what)
        if "args" not in value:
            return target
        args = value["args"]
        if not isinstance(args, Mapping):
            raise PlanError(f"{what} {path!r}: args must be a dict of keyword arguments, got {args!r}")
        kwargs = {k: resolve(v, trust, f"{what} {path!r} argument {k!r}") for k, v in args.items()}
        return _call(target, kwargs, path, what)
    if isinstance(value, (list, tuple)):
        return [resolve(v, trust, what) for v in value]
    if isinstance(value, Mapping):
        return {k: resolve(v, trust, what) for k, v in value.items()}
    return value


def _frozen(value: Any) -> Any:
    """Lists as tuples, deeply: JSON has no tuples, and a frozen dataclass must stay hashable."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _call(target: Any, kwargs: dict[str, Any], path: str, what: str) -> Any:
    if not callable(target):
        raise PlanError(f"{what} {path!r} is not callable, so it takes no args")
    positional: list[Any] = []
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        params = ()
    for p in params:
        if p.kind is p.VAR_POSITIONAL and p.name in kwargs:
            positional = list(kwargs.pop(p.name))
    if dataclasses.is_dataclass(target) and target.__dataclass_params__.frozen:
        kwargs = {k: _frozen(v) for k, v in kwargs.items()}
        positional = [_frozen(v) for v in positional]
    try:
        return target(*positional, **kwargs)
    except MdataError:  # the object's own validation: keep its type and message
        raise
    except Exception as exc:
        raise PlanError(f"building {what} {path!r} failed: {type(exc).__name__}: {exc}") from exc


def scheduler_trust() -> Trust:
    """What the scheduler may import while reading a job's spec: mdata's built-in cost models and
    the modules its operator lists in ``mdata.planner.trusted-modules`` (read from the scheduler's
    own configuration, never from the client). Transforms are never resolved there."""
    from mdata import config

    modules = config.get("planner.trusted-modules") or ()
    if isinstance(modules, str):
        modules = [m for m in modules.replace(",", " ").split() if m]
    return Trust(modules, where="on the scheduler")
