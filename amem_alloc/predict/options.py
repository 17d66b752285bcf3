"""The options of a prediction's run, in one table: each row its name, default, command-line flag,
choices and meaning. The API (`predict`, `predicting`, the session) and `amem predict` take them by
these names; a bad value is refused with one line (ValueError), never passed on.

    strict   False       --strict         a read of a fake tensor's value stops the prediction
    shapes   "expected"  --shapes RULE    sizes only values decide (rules/data_dependent.py)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHAPE_RULES = ("expected", "upper")   # rules/data_dependent.py says what each takes


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    flag: str
    choices: tuple | None
    meaning: str


OPTIONS = (
    Option("strict", False, "--strict", None,
           "stop at the first read of a fake tensor's value (loss.item(), print(t)) instead of answering it "
           "with a stand-in (exit status 3)"),
    Option("shapes", "expected", "--shapes", SHAPE_RULES,
           "sizes only values decide (nonzero, boolean masks, a router's choice of experts): 'expected' takes "
           "balanced routing and samplers' fixed sizes; 'upper' the worst case the program allows (every "
           "token to the same experts, every RoI on one level, every element of a mask it did not fix), the "
           "worst case of sizes: the allocator's reserved memory can still come out lower, its blocks "
           "splitting differently; the notes give the other rule's figure where they differ (default: expected)"),
)
BY_NAME = {o.name: o for o in OPTIONS}


def default(name: str) -> Any:
    return BY_NAME[name].default


def check(name: str, value: Any) -> Any:
    """`value` for option `name`, or ValueError naming the choices."""
    option = BY_NAME[name]
    if option.choices is not None and value not in option.choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, option.choices))}, got {value!r}")
    if option.choices is None and isinstance(option.default, bool) and not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def add_arguments(parser: Any) -> None:
    """Every option as a command-line flag (argparse): a switch for a bool, a choice otherwise."""
    for o in OPTIONS:
        if isinstance(o.default, bool):
            parser.add_argument(o.flag, dest=o.name, action="store_true", help=o.meaning)
        else:
            parser.add_argument(o.flag, dest=o.name, choices=o.choices, default=o.default, help=o.meaning)


def describe() -> str:
    """The table as text (docs/predict.md shows it)."""
    return "\n".join(f"{o.flag:<10} {o.name}={o.default!r}: {o.meaning}" for o in OPTIONS)
