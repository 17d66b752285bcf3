"""Configuration: AMEM_CONF strings and enable()/Allocator keyword arguments.

The options table lives in C++ (csrc/core/options.h); this module only turns keyword arguments
into the same `key:value,...` text, merges it over AMEM_CONF, and lets the core validate it, so
a bad key or value raises the core's ValueError naming the key and what it accepts.

The core's option defaults are torch's own policy (faithful replays, `amem-defaults`). What
amem_alloc.enable() puts in place starts from a named policy instead — `amem` unless
AMEM_POLICY or enable(policy=...) names another (amem_alloc/policies.py) — with AMEM_CONF and the
keyword options laid over it, key by key.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from . import _C, policies

ENV_VAR = "AMEM_CONF"
POLICY_ENV_VAR = "AMEM_POLICY"
DEFAULT_POLICY = "amem"


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, Mapping):  # roundup_power2_divisions={256: 1, ">": 8}
        return "[" + ",".join(f"{k}:{v}" for k, v in value.items()) + "]"
    raise ValueError(
        f"AMEM_CONF: option '{key}' got a {type(value).__name__}; pass a number, True/False, "
        "or for roundup_power2_divisions a dict {interval_MiB: divisions, '>': divisions}"
    )


def to_conf_string(options: Mapping[str, Any]) -> str:
    """{'max_split_size_mb': 512} -> 'max_split_size_mb:512'."""
    return ",".join(f"{key}:{_format_value(key, value)}" for key, value in options.items())


def resolve(options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> str:
    """AMEM_CONF overlaid by keyword options; validated; returned as a conf string."""
    env = os.environ if env is None else env
    parts = [p for p in (env.get(ENV_VAR, "").strip(), to_conf_string(options or {})) if p]
    conf = ",".join(parts)
    try:
        conf.encode("utf-8")
    except UnicodeEncodeError:  # bytes the environment could not decode (lone surrogates)
        raise ValueError(f"{ENV_VAR}: {conf!r} is not valid text; write the options as ASCII "
                         "key:value pairs, e.g. max_split_size_mb:512") from None
    _C.canonical_config(conf)  # raises ValueError naming the bad key or value
    return conf


@dataclass(frozen=True)
class PolicyConfig:
    """A policy with the user's options over it: the conf string, and whether expandable segments
    are the policy's choice rather than the user's (enable(): then a device that cannot map pages
    gets plain segments)."""
    conf: str
    policy: str
    expandable_optional: bool


def resolve_with_policy(options: Mapping[str, Any] | None = None, policy: str | None = None,
                       env: Mapping[str, str] | None = None) -> PolicyConfig:
    """The named policy (argument, else AMEM_POLICY, else `amem`), overlaid by AMEM_CONF, then by
    keyword options; validated. ValueError names a bad policy, key or value. What enable() runs;
    Allocator passes its own policy and no environment."""
    env = os.environ if env is None else env
    name = (policy if policy is not None else env.get(POLICY_ENV_VAR, "").strip()) or DEFAULT_POLICY
    try:
        chosen = policies.get(name)
    except ValueError as err:
        raise ValueError(f"{POLICY_ENV_VAR if policy is None else 'policy'}: {err}") from None
    user = resolve(options, env)
    conf = ",".join(p for p in (chosen.conf, user) if p)
    _C.canonical_config(conf)
    user_sets_expandable = re.search(r"(^|,)\s*expandable_segments\s*:", user) is not None
    return PolicyConfig(conf, chosen.name, expandable_optional=not user_sets_expandable)


def canonical(conf: str = "") -> str:
    """Every option, defaults included, as `key:value,...`."""
    return _C.canonical_config(conf)


def option_table() -> list[tuple[str, str, str]]:
    """(name, default, accepted values and meaning) for every option."""
    return [tuple(row) for row in _C.option_table()]


def describe() -> str:
    """The options table as text, for `amem config` and the README."""
    rows = option_table()
    width = max(len(name) for name, _, _ in rows)
    return "\n".join(f"{name:<{width}}  default {default:<9}  {doc}" for name, default, doc in rows)
