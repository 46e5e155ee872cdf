"""Keyword arguments that were renamed or grouped keep working for a while, with one warning each.

A function decorated with :func:`renamed_keywords` shows only its new parameters (``inspect.signature``
follows ``__wrapped__``), but still accepts the old keywords: each is translated to the new spelling and
warns once per function and old name, with a ``FutureWarning`` (shown in notebooks by default, unlike a
``DeprecationWarning`` raised inside a library) that names the new spelling.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

# old spellings already warned about: one warning each per process is enough to act on.
_WARNED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Into:
    """An old keyword that became the field ``field`` of the settings object passed as ``group``."""

    group: str
    field: str


@dataclasses.dataclass(frozen=True)
class Then:
    """An old keyword that became a call on the result: ``apply(result, value)``; ``spelling`` says which."""

    spelling: str
    apply: Callable[[Any, Any], None]


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn, once per process and ``old`` spelling, that ``old`` (a keyword or a command-line flag) is now
    spelled ``new``."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    warnings.warn(f"{old} is now {new}; the old spelling will be removed", FutureWarning, stacklevel=stacklevel)


def warn_once(function: str, old: str, new: str, stacklevel: int = 4) -> None:
    """Warn (once per ``function`` and ``old``) that ``function(old=...)`` is now spelled ``new``."""
    warn_renamed(f"{function}({old}=...)", new, stacklevel=stacklevel)


def _spelling(function: str, old: str, target: str | Into | Then, defaults: Mapping[str, Any]) -> str:
    if isinstance(target, str):
        return f"{function}({target}=...)"
    if isinstance(target, Then):
        return target.spelling
    group_type = type(defaults[target.group]).__name__
    return f"{function}({target.group}={group_type}({target.field}=...))"


def renamed_keywords(function: str, defaults: Mapping[str, Any] | None = None,
                     **renames: str | Into | Then) -> Callable:
    """Decorator: accept the old keywords ``renames`` and pass them on in their new form.

    Args:
        function: the name in the warning, e.g. ``"predict"``.
        defaults: for each settings parameter (``"nms"``), the object used when the caller passed None; old
            keywords are applied to it (or to the caller's object) with ``dataclasses.replace``.
        **renames: old keyword -> a new keyword name (``str``), a field of a settings object (:class:`Into`),
            or a call on the result (:class:`Then`).

    Raises:
        TypeError: the old and the new spelling of the same keyword are both given.
    """
    defaults = dict(defaults or {})

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            old = {name: kwargs.pop(name) for name in list(kwargs) if name in renames}
            if not old:
                return func(*args, **kwargs)
            grouped: dict[str, dict[str, Any]] = {}
            after: list[tuple[Then, Any]] = []
            for name, value in old.items():
                target = renames[name]
                warn_once(function, name, _spelling(function, name, target, defaults))
                if isinstance(target, str):
                    if target in kwargs:
                        raise TypeError(f"{function}() got both {name}= and its new spelling {target}=")
                    kwargs[target] = value
                elif isinstance(target, Into):
                    grouped.setdefault(target.group, {})[target.field] = value
                else:
                    after.append((target, value))
            for group, fields in grouped.items():
                base = kwargs.get(group)
                kwargs[group] = dataclasses.replace(defaults[group] if base is None else base, **fields)
            result = func(*args, **kwargs)
            for target, value in after:
                target.apply(result, value)
            return result

        return wrapper

    return decorate


# The flat NMS and output keywords of predict/evaluate before they were grouped (NMSConfig, SaveConfig).
NMS_KEYWORDS = {name: Into("nms", name) for name in ("conf", "iou", "max_det", "classes", "agnostic")}
SAVE_KEYWORDS = {"save_dir": Into("save", "save_dir"), "save_txt": Into("save", "txt"),
                 "save_conf": Into("save", "conf"), "save_images": Into("save", "images"),
                 "line_width": Into("save", "line_width")}
