"""One declaration per training setting: ``declare(default, help, ...)`` beside each field of the parts of a
``TrainConfig`` (its ``step``, ``optim``, ``pipeline`` and ``run``, marked with ``part``).

A setting has one name across the API, the command line and the checkpoints (``TrainConfig(imgsz=320)``,
``--imgsz`` where it has a flag, ``imgsz`` in a checkpoint's ``train_config``): the field's, or the declared
``setting`` where the part words it differently (the step's ``batch_size`` is the setting ``micro_batch_size``).
A field's declaration holds everything the kit knows of it besides its type: the default (the field's),
what it means (``help``), its range or choices, its command-line flag (or why it has none) and what a
resumed run may do with it. ``TrainConfig`` checks its values with :meth:`Declared.problem`; the ``train``
command builds its flags, their help and their checks from the same declarations (``yolo9kit.cli.train``),
and ``yolo9kit.train.rundir`` reads the resume rule, so no rule is written twice.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# What a resumed run does with a setting:
KEEP = "keep"  # the run's value: a resume that asks for another is refused (the data order, the schedule, ...)
CHANGE = "change"  # a resume may set it (how long, where and how fast the run goes on)
RUN = "run"  # the resume itself decides it (which run to resume, and where its folder is)
RESUME_RULES = (KEEP, CHANGE, RUN)


@dataclass(frozen=True)
class Declared:
    """The declaration of one setting (read with :func:`declarations`)."""

    help: str  # one line: what it does, for --help and the docs
    setting: str | None = None  # the setting's name where it is not the field's (unique over all parts)
    flag: str | None = None  # the train command's flag, e.g. "--batch-size"
    aliases: tuple[str, ...] = ()  # official spellings also accepted, e.g. "--batch"
    no_flag: str | None = None  # why there is no flag of its own: which flag sets it, or that it is API only
    negate: bool = False  # a bool whose flag turns it off (--noval, --no-plots)
    resume: str = KEEP
    low: float | None = None  # the smallest value (None: no bound)
    low_open: bool = False  # the bound itself excluded: value > low
    high: float | None = None
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    multiple: int | None = None  # the value must be a multiple of this (image sizes of the stride 32)
    integer: bool = False  # a whole number (bool excluded), also when None is allowed

    def __post_init__(self) -> None:
        if (self.flag is None) == (self.no_flag is None):
            raise ValueError(f"a setting has a flag or says why it has none, not both or neither: {self.help!r}")
        if self.resume not in RESUME_RULES:
            raise ValueError(f"resume={self.resume!r}: expected one of {RESUME_RULES}")

    @property
    def expected(self) -> str:
        """The allowed values in words: ``an integer >= 1``, ``a number in [0, 1)``, ``one of (...)``."""
        if self.choices is not None:
            return f"one of {self.choices}"
        kind = "an integer" if self.integer else "a number"
        if self.multiple:
            return f"a multiple of {self.multiple} (the largest model stride)"
        if self.low is not None and self.high is not None:
            return f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}" \
                   f"{')' if self.high_open else ']'}"
        if self.low is not None:  # unbounded above: "finite" says that infinity is refused too
            return f"{'an integer' if self.integer else 'a finite number'} {'>' if self.low_open else '>='} " \
                   f"{_num(self.low)}"
        return "a whole number" if self.integer else "a value"

    def problem(self, value: Any, optional: bool = False) -> str | None:
        """None when ``value`` is allowed, else what was expected (``optional``: None is allowed too)."""
        if value is None and optional:
            return None
        if self.choices is not None:
            return None if value in self.choices else self.expected
        if self.integer and (isinstance(value, bool) or not isinstance(value, int)):
            return "a whole number" + (" or None" if optional else "")
        numeric = self.low is not None or self.high is not None or self.multiple
        if not numeric:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return self.expected
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        off_grid = bool(self.multiple) and value % self.multiple != 0
        return self.expected if too_low or too_high or off_grid else None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def declare(default: Any, help: str, **declaration: Any) -> Any:  # noqa: A002 (argparse's word)
    """A dataclass field with its default and its :class:`Declared` (``help``, ``flag`` or ``no_flag``, ...)."""
    extra = {"compare": declaration.pop("compare")} if "compare" in declaration else {}
    return field(default=default, metadata={"declared": Declared(help, **declaration)}, **extra)


def part(config_type: type) -> Any:
    """A field holding a part of a composed config (a frozen dataclass with declared fields of its own)."""
    return field(default_factory=config_type, metadata={"part": config_type})


def declarations(config_type: type) -> dict[str, tuple[dataclasses.Field, Declared]]:
    """Setting name -> (the dataclass field, its Declared), in declaration order, the parts' settings included."""
    return {name: (f, declared) for name, (_, f, declared) in settings(config_type).items()}


def settings(config_type: type) -> dict[str, tuple[str | None, dataclasses.Field, Declared]]:
    """Setting name -> (the part holding it, None for the config's own fields; its field; its Declared)."""
    out: dict[str, tuple[str | None, dataclasses.Field, Declared]] = {}
    for f in dataclasses.fields(config_type):
        if "declared" in f.metadata:
            out[f.metadata["declared"].setting or f.name] = (None, f, f.metadata["declared"])
        elif "part" in f.metadata:
            for name, (_, inner, declared) in settings(f.metadata["part"]).items():
                if name in out:
                    raise ValueError(f"two settings named {name!r} in {config_type.__name__}")
                out[name] = (f.name, inner, declared)
    return out


def check_declared(config: Any) -> None:
    """Every declared value of ``config`` in its range, else a ValueError ``Type.name=value: expected ...``."""
    owner = type(config).__name__
    for f in dataclasses.fields(config):
        if "declared" not in f.metadata:
            continue
        name, declared = f.name, f.metadata["declared"]
        value = getattr(config, name)
        problem = declared.problem(value, optional="None" in str(f.type))
        if problem is not None:
            raise ValueError(f"{owner}.{name}={value!r}: expected {problem}")
