"""A small transparent function wrapper, so PyTriton's decorators keep their calling convention
`wrapper(wrapped, instance, args, kwargs)` without a dependency.

Like PyTriton's, a wrapped callable forwards attribute reads and writes and `str()` to what it wraps (so the
triton context set on the outermost wrapper reaches the function, and every layer names the same function), binds
as a method when it decorates one, and keeps `__wrapped__` and `_self_wrapper` for decorators that inspect the stack.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

__all__ = ["FunctionWrapper", "decorator", "wrapper_stack"]

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

_OWN = frozenset({"__wrapped__", "_self_wrapper", "_self_instance"})


class FunctionWrapper:
    """`wrapped` called through `wrapper`; `instance` is the object a method wrapper was bound to."""

    __slots__ = ("__wrapped__", "_self_wrapper", "_self_instance", "__weakref__")

    def __init__(self, wrapped: Callable[..., Any], wrapper: Wrapper, instance: Any = None) -> None:
        object.__setattr__(self, "__wrapped__", wrapped)
        object.__setattr__(self, "_self_wrapper", wrapper)
        object.__setattr__(self, "_self_instance", instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._self_wrapper(self.__wrapped__, self._self_instance, args, kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        binder = getattr(self.__wrapped__, "__get__", None)
        if binder is None:
            return self
        return FunctionWrapper(binder(instance, owner), self._self_wrapper, instance)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "__wrapped__"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.__wrapped__, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__wrapped__, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by reference, as functions are: a bound wrapper as its object's attribute, a module-level one by
        # the name of the function it decorates (which names the outermost wrapper in that module).
        wrapped = self.__wrapped__
        if self._self_instance is not None:
            return (getattr, (self._self_instance, wrapped.__name__))
        qualname = getattr(wrapped, "__qualname__", "")
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise pickle.PicklingError(f"{qualname} is defined inside a function: it cannot be found by name")
        return (_by_name, (wrapped.__module__, qualname))

    def __str__(self) -> str:
        return str(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<FunctionWrapper around {self.__wrapped__!r}>"

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(self.__wrapped__, "__doc__", None)


def _by_name(module: str, qualname: str) -> Any:
    import importlib

    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def decorator(wrapper: Wrapper) -> Callable[[Callable[..., Any]], FunctionWrapper]:
    """Turn `wrapper(wrapped, instance, args, kwargs)` into a decorator; the decorator remembers its wrapper as
    `__wrapper__` so that `wrapper_stack` can tell which decorators a callable carries."""

    def apply(wrapped: Callable[..., Any]) -> FunctionWrapper:
        return FunctionWrapper(wrapped, wrapper)

    apply.__name__ = getattr(wrapper, "__name__", "decorator")
    apply.__qualname__ = getattr(wrapper, "__qualname__", apply.__name__)
    apply.__doc__ = wrapper.__doc__
    apply.__wrapper__ = wrapper  # type: ignore[attr-defined]
    return apply


def wrapper_stack(wrapped: Any) -> list[Any]:
    """The wrappers applied to a callable, outermost first (following `__wrapped__`)."""
    stack = []
    current = wrapped
    while current is not None:
        found = getattr(current, "_self_wrapper", None) if isinstance(current, FunctionWrapper) else None
        if found is None:
            found = getattr(current, "_self_wrapper", None)  # another library's wrapper with the same convention
        if found is not None:
            stack.append(found)
        current = getattr(current, "__wrapped__", None)
    return stack
