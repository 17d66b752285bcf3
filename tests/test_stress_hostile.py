"""Hostile input through the Python API: fuzzed AMEM_CONF strings and hostile arguments to every
Allocator call. Each bad input may only raise a clear error of the documented kind (ValueError,
TypeError, MemoryError for out of memory) — never crash, never another exception, never change the
allocator's state. Hypothesis runs derandomized without a database, so CI sees the same inputs
every time, and shrinks a failure to the shortest input or call sequence.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import amem_alloc
from amem_alloc import Allocator, OutOfMemoryError, _C
from amem_alloc.config import resolve
from helpers import run_python

KiB = 1024
MiB = 1024 * KiB
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), print_blob=False)

VALID_CONFS = [
    "",
    "max_split_size_mb:40",
    "max_split_size_mb:unlimited,max_non_split_rounding_mb:64",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6,debug_checks:True",
    "max_split_size_mb:200, roundup_power2_divisions:[1:8,>:2], garbage_collection_threshold:0.25",
    "expandable_segments:True",
]
# Characters the syntax cares about, numbers' pieces, whitespace, NUL and a few non-ASCII ones.
PIECES = st.sampled_from(list(":,[]>-+.eEx_ \t\n0123456789") + ["\x00", "\x7f", "é", "∞", "nan", "inf", "True",
                                                                 "unlimited", "9" * 30])


@st.composite
def mutated_confs(draw) -> str:
    """A valid AMEM_CONF string with a few characters inserted, deleted, replaced or repeated."""
    text = draw(st.sampled_from(VALID_CONFS))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "repeat"]))
        piece = draw(PIECES)
        if op == "insert":
            text = text[:at] + piece + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 3)):]
        elif op == "replace":
            text = text[:at] + piece + text[at + 1:]
        else:
            text = text[:at] + text[at:at + draw(st.integers(1, 12))] * 2 + text[at + 12:]
    return text


def parse_or_refuse(conf: str) -> str | None:
    """The canonical settings for conf, or None if it was refused with a ValueError."""
    try:
        canonical = amem_alloc.canonical_config(conf)
    except ValueError as err:  # ConfigError; UnicodeEncodeError for lone surrogates
        assert str(err), "an error without a message"
        return None
    assert amem_alloc.canonical_config(canonical) == canonical, "the canonical form is a fixed point"
    return canonical


# ------------------------------------------------------------------ AMEM_CONF


@FUZZ
@given(st.text(max_size=60))
def test_random_conf_text_parses_or_raises_valueerror(conf):
    parse_or_refuse(conf)


@FUZZ
@given(mutated_confs())
def test_mutated_confs_parse_or_raise_valueerror_and_accepted_ones_work(conf):
    canonical = parse_or_refuse(conf)
    if canonical is None:
        return
    settings_ = json.loads(_C.config_json(conf))
    assert settings_["max_split_size"] == -1 or settings_["max_split_size"] >= 20 * MiB
    assert 0 <= settings_["garbage_collection_threshold"] < 1
    assert all(d & (d - 1) == 0 for d in settings_["roundup_power2_divisions"])
    core = _C.CoreAllocator("sim", conf, 256 * MiB)  # the core runs with what was accepted
    for size in (1000, 3 * MiB, 30 * MiB):
        core.free(core.malloc(size, 0))
    core.check_valid()


@FUZZ
@given(st.one_of(mutated_confs(), st.text(max_size=30)))
def test_conf_from_the_environment_is_checked_the_same_way(conf):
    try:
        resolved = resolve({}, env={"AMEM_CONF": conf})
    except ValueError:
        assert parse_or_refuse(conf.strip()) is None
        return
    assert parse_or_refuse(resolved) is not None


# Text that is not valid UTF-8 (os.environ carries such bytes as lone surrogates, e.g.
# AMEM_CONF=$'\\xff' gives '\\udcff') once reached pybind11 as a TypeError.
@pytest.mark.parametrize("conf", ["\udcff", "max_split_size_mb:\udc80"])
def test_amem_conf_that_is_not_utf8_is_a_valueerror(conf):
    with pytest.raises(ValueError, match="AMEM_CONF"):
        resolve({}, env={"AMEM_CONF": conf})


def test_malformed_amem_conf_makes_enable_raise_and_the_process_carries_on():
    """enable() in a fresh process, once per bad string: a ValueError naming the problem, nothing
    installed, and the process goes on (no crash, no half-installed allocator)."""
    bad = ["max_split_size_mb:", ":::", "max_split_size_mb:5", "roundup_power2_divisions:[", "\x01",
           "garbage_collection_threshold:nan", "debug_checks:maybe", "x" * 100_000,
           "max_split_size_mb:" + "9" * 400, "roundup_power2_divisions:[1:3]"]
    proc = run_python(f"""
        import json, os, amem_alloc
        out = []
        for conf in {bad!r}:
            os.environ["AMEM_CONF"] = conf
            try:
                amem_alloc.enable()
                out.append("enabled")
            except ValueError as err:
                out.append("ValueError: " + str(err)[:120])
        print(json.dumps({{"results": out, "enabled": amem_alloc.is_enabled()}}))
    """)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["enabled"]
    for conf, outcome in zip(bad, result["results"]):
        assert outcome.startswith("ValueError: AMEM_CONF"), (conf[:40], outcome)


# ------------------------------------------------------------------ the Allocator API

HOSTILE_INTS = st.one_of(
    st.integers(),                                                    # any size, negative and huge too
    st.sampled_from([-1, 0, 1, 511, 512, 2**56, 2**56 + 1, 2**63, 2**64 - 1, 2**64, -(2**63), 2**200]),
    st.integers(1, 64 * MiB),
)
HOSTILE_VALUES = st.one_of(HOSTILE_INTS, st.floats(allow_nan=True), st.booleans(), st.none(),
                           st.text(max_size=5), st.binary(max_size=5))
EXPECTED = (ValueError, TypeError, OutOfMemoryError)


class HostileCalls(RuleBasedStateMachine):
    """Random calls with hostile arguments beside ordinary ones; after each, the allocator must be
    valid and its counters must match the blocks the test holds."""

    def __init__(self):
        super().__init__()
        self.alloc = Allocator("sim", limit_bytes=256 * MiB)
        self.live: dict[int, int] = {}  # address -> block size
        self.invalid_frees = 0

    def _call(self, fn, *args):
        before = self.alloc.memory_stats()
        try:
            return fn(*args)
        except EXPECTED as err:
            assert str(err), f"{fn.__name__}{args!r}: an error without a message"
            after = self.alloc.memory_stats()
            if isinstance(err, OutOfMemoryError):  # the cache may have been released: stats move
                assert "out of memory" in str(err)
            else:
                for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.current"):
                    assert after[key] == before[key], (fn.__name__, args, key)
            return None

    @rule(size=HOSTILE_VALUES, stream=HOSTILE_VALUES)
    def malloc(self, size, stream):
        p = self._call(self.alloc.malloc, size, stream)
        if p:  # a request that passed every check got a fresh block
            assert p not in self.live
            self.live[p] = self.alloc.block_info(p)["size"]

    @rule(size=st.integers(1, 8 * MiB), stream=st.integers(0, 3))
    def malloc_ordinary(self, size, stream):
        self.malloc(size, stream)

    @rule(address=HOSTILE_VALUES)
    def free_hostile(self, address):
        if isinstance(address, int) and not isinstance(address, bool) and address in self.live:
            return  # a real block: not hostile
        counted = isinstance(address, int) and not isinstance(address, bool) and 0 < address < 2**64
        if type(address) is int and address == 0:
            self.alloc.free(0)  # freeing null is a no-op
            return
        with pytest.raises(EXPECTED):
            self.alloc.free(address)
        self.invalid_frees += counted

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 1 << 16), twice=st.booleans())
    def free_real(self, pick, twice):
        p = sorted(self.live)[pick % len(self.live)]
        self.alloc.free(p)
        del self.live[p]
        if twice:  # "double free", or "inside the block" once it merged with a free neighbour
            with pytest.raises(amem_alloc.InvalidFreeError, match="double free|inside the block"):
                self.alloc.free(p)
            self.invalid_frees += 1

    @rule(address=HOSTILE_VALUES, stream=HOSTILE_VALUES)
    def record_stream(self, address, stream):
        self._call(self.alloc.record_stream, address, stream)

    @rule(address=HOSTILE_VALUES)
    def block_info(self, address):
        info = self._call(self.alloc.block_info, address)
        if info is not None:
            assert info["address"] in self.live

    @rule(fraction=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.none(),
                             st.sampled_from([0.5, 1.0, -0.0])))
    def set_memory_fraction(self, fraction):
        self._call(self.alloc.set_memory_fraction, fraction)

    @rule()
    def empty_cache(self):
        self.alloc.empty_cache()

    @invariant()
    def consistent(self):
        self.alloc.check_valid()
        s = self.alloc.memory_stats()
        assert s["allocation.all.current"] == len(self.live)
        assert s["allocated_bytes.all.current"] == sum(self.live.values())
        assert s["num_invalid_frees"] == self.invalid_frees

    def teardown(self):
        for p in list(self.live):
            self.alloc.free(p)
        self.alloc.empty_cache()
        assert self.alloc.memory_stats()["reserved_bytes.all.current"] == 0


def test_hostile_calls_to_the_allocator():
    run_state_machine_as_test(HostileCalls, settings=settings(FUZZ, max_examples=150, stateful_step_count=40))


@pytest.mark.parametrize("fraction", [math.nan, math.inf, -math.inf, -0.5, 1.5, "half", None])
def test_bad_memory_fractions_are_refused_and_change_nothing(fraction):
    alloc = Allocator("sim", limit_bytes=64 * MiB)
    with pytest.raises((ValueError, TypeError)):
        alloc.set_memory_fraction(fraction)
    alloc.free(alloc.malloc(60 * MiB))  # no cap was set
