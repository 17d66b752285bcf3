"""Decode loops: a KV-cache decode loop's later steps written out from the steps run, not run.

Design note
-----------
Inference decodes one token per step: the model runs on the last token with its KV cache, and
the cache grows by one token. Each step makes the same allocations in the same order, and those
sized by the context (a DynamicCache's keys and values, concatenated anew each step; a mask) grow by
the same bytes each step; a StaticCache's steps are alike to the byte. Running hundreds or
thousands of such steps on fake tensors costs as much as the first few and gives nothing new. So
once the last `repeat.GROW_RUN` steps of a loop had one shape and grew alike (repeat.growth), the
loop is ended there and the steps it had left are written out (repeat.extend_at, copy j grown j
times): exact for the program, which the allocator then replays step by step as CUDA would see it.

Where a loop's steps begin and end, and how many it had left:

* `generate()` (transformers): each call of `GenerationMixin._has_unfinished_sequences` is a loop
  head (greedy, sampling, beam search and assisted decoding all ask it); the steps left are the
  longest the stopping criteria allow, `max_length` less the tokens so far (`MaxLengthCriteria`,
  asked each step), at the tokens each of the last steps added (one; assisted decoding adds the
  accepted candidates and one more). An end-of-sequence criterion's answer is a value no prediction computes: it is
  made "no sequence ended" (a known value, engine/known.py), so the loop runs to `max_new_tokens`
  as the longest generation does, and the prediction is its upper bound (a note says so). Ending
  the loop at a head is answering "nothing left": generate then returns as it would at its end,
  and the sequences it returns are lengthened by the steps written out (`_lengthened`), so that
  what the program does with them next (a forward over prompt and completion) sees the run's
  length; that one tensor is an allocation the run made in its last step instead.
* A loop in the user's code (`for _ in range(n): out = model(tok, past_key_values=cache)`, under
  `torch.inference_mode()` or `no_grad`): each return of the outermost module is a step's end; the
  steps left are what the loop's `range` iterator still holds (found on the user's frame, itself or
  inside an `enumerate`). It is ended by emptying that iterator: the step running finishes, the
  code after the loop runs; what the step ran after the model's return (as the written-out steps'
  first ops) is grown as the last step's would be, and later frees of the last steps' blocks move to
  the written-out ones'. A loop that is not over a `range` runs every step. What the loop built
  (`out = torch.cat((out, token))`) holds only the steps run: the note says code after the loop
  sees it shorter than a real run would (no rule here can know which tensor is the loop's result).
* A library's loop between the model and the user's code (a diffusers pipeline's denoising loop,
  `for t in self.progress_bar(self.scheduler.timesteps)`, under `no_grad`): the same, where it runs
  over a range, a tuple or a list (a tensor iterates as the tuple of its rows), directly or
  through a generator that wraps it (tqdm's progress bar: the sequence is read from the suspended
  generator's stack, and emptying it ends the generator's loop, and so the library's). The steps
  written out are the last ones run: a step that the loop's end alone changes is written out as
  the others (DDPM's last step draws no noise: the written-out program has that one temporary more).

Each loop written out is a note ("written-out"): where, how many steps ran, how many were written.
"""
from __future__ import annotations

import collections
import functools
import gc
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import code_files
from ..patching import declare
from . import notes, repeat

NOT_AFFINE = {"_scaled_dot_product_flash_attention"}   # ops whose scratch is piecewise in the context length
WARMUP = 2   # steps of a loop not taken as its shape: the prefill's, and the first that frees its blocks

HEAD = declare("transformers.generation.utils.GenerationMixin", "_has_unfinished_sequences",
               "each call is a decode loop's head: ends the loop once its later steps can be written out")
MAX_LENGTH = declare("transformers.generation.stopping_criteria.MaxLengthCriteria", "__call__",
                     "tells how many decode steps generate() has left")
EOS = declare("transformers.generation.stopping_criteria.EosTokenCriteria", "__call__",
              "no sequence ended (a known value): generate() runs to max_new_tokens, the upper bound")
BEAMS_OPEN = declare("transformers.generation.utils.GenerationMixin", "_beam_search_has_unfinished_sequences",
                     "beams taken as still improvable (a known value): beam search runs to max_new_tokens")
CACHE_UPDATE = declare("transformers.cache_utils.Cache and each subclass defining it", "update",
                       "the keys and values a KV cache hands back are its own: their storages are kv_cache")
GENERATE = declare("transformers.generation.utils.GenerationMixin", "generate",
                   "where its decode loop's last steps were written out (not run), the sequences it returns are as "
                   "long as the run's: the steps written out are added (their tokens' values unknown, as every "
                   "token's under prediction)")
STOP_STRINGS = declare("transformers.generation.stopping_criteria.StopStringCriteria", "__call__",
                       "no stop string met (a known value): generate() runs to max_new_tokens, the upper bound")


GENERATION_IMPORT = declare("sys", "meta_path", "a copy, first of all finders one that patches generate() as "
                            "transformers' generation module is imported (decode_loop.py)")


@dataclass
class Loop:
    where: str                                       # the user's line that runs the loop
    bounds: list[int] = field(default_factory=list)  # op index at each step's end
    owner: Any = None                                # a user loop's range iterator
    lengths: list[int] = field(default_factory=list) # generate(): the sequences' length at each head
    trains: bool = False                             # a step ran a backward or an optimizer step


@dataclass
class WrittenOut:
    spans: list[tuple[int, int]]   # the steps run (op indices) up to the last, which is copied
    copies: int                    # steps written out
    grow: list[int]                # bytes each allocation grows per step
    grow_after: bool               # the ops after the last span begin with a step's first ops (a user loop)


class DecodeLoops:
    """Finds decode loops while a session runs, ends them, and writes their steps out afterwards."""

    def __init__(self, session: Any, write_out: bool = True) -> None:
        self.session, self.write_out = session, write_out   # write_out False: every step runs
        self.loops: dict[Any, Loop] = {}
        self.written: list[WrittenOut] = []
        self.left: int | None = None   # generate(): tokens left, as MaxLengthCriteria last said
        self.length: int | None = None   # ... and the sequences' length it saw
        self.reached = 0                 # ... the last of those in the generate() call running
        self.cut: list[int] = []       # per generate() call running (innermost last): the length its
        # loop would have reached where its steps left were written out (0: none were)
        self._patched = False

    # ------------------------------------------------------------------ installing
    def install(self) -> None:
        """Listens to the outermost modules' calls (the session's ModuleScope, provenance/scope.py),
        and patches generate() once transformers' generation is imported: a script's
        first generate() call may come before any forward of its own."""
        self.session.modules.outermost.append(self._outermost)
        self.session.patches.when_imported(GENERATION_IMPORT, "transformers.generation.utils",
                                           self._patch_transformers)

    def remove(self) -> None:
        if self._outermost in self.session.modules.outermost:
            self.session.modules.outermost.remove(self._outermost)

    def _patch_transformers(self) -> None:
        """Patches generate()'s loop once transformers' generation is imported (checked at each
        outermost forward: a script imports transformers after the session began)."""
        if self._patched or "transformers.generation.utils" not in sys.modules:
            return
        self._patched = True
        from transformers.generation import stopping_criteria as sc
        from transformers.generation.utils import GenerationMixin

        patches, loops = self.session.patches, self
        head, max_length = GenerationMixin._has_unfinished_sequences, sc.MaxLengthCriteria.__call__

        def has_unfinished(model, *args, **kwargs):
            if loops._generate_head(sys._getframe(1)):
                return False
            return head(model, *args, **kwargs)

        def steps_left(criterion, input_ids, *args, **kwargs):
            loops.length = loops.reached = input_ids.shape[-1]
            loops.left = criterion.max_length - loops.length
            return max_length(criterion, input_ids, *args, **kwargs)

        generate = GenerationMixin.generate

        def generated(model, *args, **kwargs):
            loops.cut.append(0)
            loops.reached = 0   # the length its loop reaches (MaxLengthCriteria's last call)
            try:
                out = generate(model, *args, **kwargs)
            finally:
                cut = loops.cut.pop()
            return _lengthened(out, cut or loops.reached)

        patches.apply(HEAD, GenerationMixin, "_has_unfinished_sequences", has_unfinished)
        patches.apply(GENERATE, GenerationMixin, "generate", generated)
        patches.apply(MAX_LENGTH, sc.MaxLengthCriteria, "__call__", steps_left)
        beams = vars(GenerationMixin).get("_beam_search_has_unfinished_sequences")
        if isinstance(beams, staticmethod):
            patches.apply(BEAMS_OPEN, GenerationMixin, "_beam_search_has_unfinished_sequences",
                          staticmethod(_always_open(beams.__func__)))
        for patch, cls in ((EOS, sc.EosTokenCriteria), (STOP_STRINGS, sc.StopStringCriteria)):
            patches.apply(patch, cls, "__call__", _never_done(cls.__call__, cls.__name__))
        self._patch_caches()

    def _patch_caches(self) -> None:
        """Cache.update (and each override of it) marks the keys and values it returns as the KV
        cache: a DynamicCache's concatenated tensors, a StaticCache's buffers."""
        from transformers import cache_utils

        classes = [c for c in vars(cache_utils).values()
                   if isinstance(c, type) and issubclass(c, cache_utils.Cache) and "update" in vars(c)]
        for cls in classes:
            self.session.patches.apply(CACHE_UPDATE, cls, "update", _marking(cls.update, self.session))

    # ------------------------------------------------------------------ loops
    def _generate_head(self, frame: Any) -> bool:
        """A generate() loop's head (frame: its decoding method's): True to end the loop here (its
        steps left written out, or none left)."""
        key = ("generate", id(frame))   # a frame takes no weak reference: forgotten when its loop ends
        loop = self.loops.get(key)
        if loop is None:
            loop = self.loops[key] = Loop(notes.call_site(2))
        loop.bounds.append(len(self.session.ops))
        left, self.left = self.left, None
        length, self.length = self.length, None
        if length is not None:
            loop.lengths.append(length)
        if self.write_out and left is not None and left > 0 and \
                self._write_out(loop, _steps_for(left, loop.lengths), grow_after=False):
            del self.loops[key]
            if self.cut:
                self.cut[-1] = length + left
            return True
        if left is not None and left <= 0:   # max_length reached: a GPU's run ends here whatever the other
            del self.loops[key]              # criteria's stand-ins say (a custom criterion's unknown answer)
            return True
        return False

    def _outermost(self, event: str) -> None:
        if event == "enter":
            self._patch_transformers()
        elif self.write_out and not torch.is_grad_enabled():
            self._step_end()

    def _step_end(self) -> None:
        """An outermost module returned, with gradients off: a step of a user's decode loop ends."""
        iterator = _user_loop()
        if iterator is None:
            return
        key = ("range", id(iterator))
        loop = self.loops.get(key)
        if loop is None or loop.owner is not iterator:   # an iterator holds no tensor: kept to tell loops apart
            loop = self.loops[key] = Loop(notes.call_site(2), owner=iterator)
        loop.bounds.append(len(self.session.ops))
        left = iterator.__length_hint__()
        if left > 0 and self._write_out(loop, left, grow_after=True):
            collections.deque(iterator, maxlen=0)   # the loop ends after the step running now
            del self.loops[key]

    def _write_out(self, loop: Loop, left: int, grow_after: bool) -> bool:
        """Whether the loop's last steps grow alike, it has at least as many steps left as it ran
        (fewer are not worth a program that differs from the run's: a 10-step DDIM loop's last step
        runs), and it trains nothing; if so, its `left` steps are to be written out."""
        ran = len(loop.bounds) - (0 if grow_after else 1)   # a user loop's bounds are step ends; generate's, heads
        if len(loop.bounds) > 1:   # (asked at each step's end: the newest step alone is read)
            loop.trains = loop.trains or self._trains(loop.bounds[-2], loop.bounds[-1])
        spans = list(zip(loop.bounds, loop.bounds[1:]))[WARMUP:]
        if left < ran or len(spans) < repeat.GROW_RUN or loop.trains:
            return False
        grow = repeat.growth(self.session.ops, spans)
        if grow is None or self._not_affine(loop, spans[-1]):
            return False
        self.written.append(WrittenOut(spans, left, grow, grow_after))
        shorter = ("" if not grow_after else f"; what the loop built (a sequence of tokens) holds the {ran} steps "
                   "run, so code after it sees it shorter than a real run would (--run-every-decode-step runs "
                   "every step)")
        notes.record(notes.WRITTEN_OUT, f"decode loop: {ran} steps ran, the {left} steps left written out from "
                     f"the last {repeat.GROW_RUN} (same allocations, each growing by the same bytes every step)"
                     f"{shorter}", where=loop.where)
        return True

    def _trains(self, begin: int, end: int) -> bool:
        """Whether the step between these op indices ran a backward pass or an optimizer step: a
        training loop whose model runs without gradients at times (a teacher or reference model
        under no_grad; a block that reentrant checkpointing runs under no_grad) is no decode loop,
        and its steps all run."""
        ops, infos = self.session.ops, self.session.infos
        return any(getattr(infos.get(key), "phase", "") in ("backward", "optimizer")
                   for kind, key, _, _ in ops[begin:end] if kind == 0)

    def _not_affine(self, loop: Loop, span: tuple[int, int]) -> bool:
        """Whether the step runs a kernel whose scratch is not affine in the context length, so that
        steps alike now may differ later: flash attention's split-KV buffers (rules/attention.py:
        the split count follows the number of 128- or 256-token blocks of keys). Such a loop runs
        every step (a note says so)."""
        ops, infos = self.session.ops, self.session.infos
        ops_of = {getattr(infos.get(key), "op", None) for kind, key, _, _ in ops[span[0]:span[1]] if kind == 0}
        varying = sorted({op.split(":")[0].split(".")[0] for op in ops_of if op} & NOT_AFFINE)
        if varying and not getattr(loop, "told", False):
            loop.told = True
            notes.record(notes.WRITTEN_OUT, f"decode loop not written out, every step runs: {varying[0]}'s scratch "
                         "changes with the context length in steps (split-KV), not by the same bytes each step",
                         where=loop.where)
        return bool(varying)

    # ------------------------------------------------------------------ the program
    def extend(self, run: Any) -> Any:
        """The RecordedRun with every loop's steps left written out (the latest loop first, so
        that the earlier ones' op indices hold)."""
        for w in sorted(self.written, key=lambda w: w.spans[-1][1], reverse=True):
            run = repeat.extend_at(run, w.spans, w.copies, w.grow, marker=None, grow_after=w.grow_after)
        return run


def _steps_for(tokens: int, lengths: list[int]) -> int:
    """The decode steps that make `tokens` more, at the tokens each of the last steps added (one;
    assisted decoding's accepted candidates and the correction: more), the last step taking what
    is left (as generate caps its candidates at max_length)."""
    added = {b - a for a, b in zip(lengths[-repeat.GROW_RUN - 1:], lengths[-repeat.GROW_RUN:])}
    per_step = added.pop() if len(added) == 1 and min(added | {1}) > 0 else 1
    return -(-tokens // per_step)


def _lengthened(out: Any, length: int) -> Any:
    """generate()'s result with its sequences as long as the run's, `length` (the loop's, had it
    run its steps written out), so that code using them (a forward over prompt and completion, as
    RL trainers run) sees the length a GPU's run returns. Beam search crops its sequences to its
    finished beams, of which a loop ended early has none: they are lengthened all the same (every
    beam runs to max_new_tokens, as the end of sequence is taken as never met); with every step run
    too, since the length it crops to is a value no prediction computes (taken as none generated).
    The longer tensor is one allocation of the sequences' size, made as generate returns (the run's
    own last step made one as large)."""
    sequences = out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2 or sequences.shape[-1] >= length:
        return out
    more = length - sequences.shape[-1]
    longer = torch.cat([sequences, sequences[:, -1:].expand(sequences.shape[0], more)], dim=-1)
    if isinstance(out, torch.Tensor):
        return longer
    out.sequences = longer
    return out


def _never_done(call: Any, name: str) -> Any:
    """A stopping criterion's __call__ whose answer is made "not done" for every sequence: its ops
    run (the same allocations), then its answer is zeroed, a value the session then knows."""
    def not_done(criterion, *args, **kwargs):
        done = call(criterion, *args, **kwargs)
        if isinstance(done, torch.Tensor):
            done.zero_()
            notes.record(notes.UPPER_BOUND, f"generate(): {name} taken as never met, every sequence runs to "
                         "max_new_tokens (the longest generation)")
        return done
    return not_done


def _always_open(test: Any) -> Any:
    """Beam search's "can any beam still improve" test, its ops run, its answer made True (known):
    scores are values no prediction has, so beams run to max_new_tokens, the longest search."""
    def still_open(*args, **kwargs):
        open_ = test(*args, **kwargs)
        if isinstance(open_, torch.Tensor):
            open_.fill_(True)
            notes.record(notes.UPPER_BOUND, "generate(): beam search taken as never finished early, its beams run "
                         "to max_new_tokens (the longest search)")
        return open_
    return still_open


def _marking(update: Any, session: Any) -> Any:
    def marked(cache, *args, **kwargs):
        out = update(cache, *args, **kwargs)
        for t in out if isinstance(out, tuple) else ():
            key = session.storages.key_of(t) if isinstance(t, torch.Tensor) else None
            if key is not None:
                session.kv_cache.add(key)
        return out
    return marked


def _user_loop() -> Any:
    """The iterator of the loop that calls the model, when its steps left are known: in the innermost
    user frame, a `range` (the iterator on its stack, or inside an enumerate there); in a library
    frame between the model and the user's code (a diffusers pipeline's denoising loop), a range, a
    tuple or a list (a tensor of timesteps iterates as a tuple of its rows), directly or through a
    generator that wraps it (tqdm's progress bar). None inside generate(), inside torch.utils.checkpoint
    (reentrant checkpointing runs a block's forward without gradients: a training step's, no decode
    step's) or where no such loop is."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if "transformers/generation/" in name or name == _CHECKPOINT_FILE:
            return None
        if code_files.is_user_file(name):
            return _range_iterator(frame)
        if code_files.is_traced_file(name):
            iterator = _sequence_iterator(frame)
            if iterator is not None:
                return iterator
        frame = frame.f_back
    return None


_CHECKPOINT_FILE = os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py")
_RANGE_ITERATORS = (type(iter(range(0))), type(iter(range(1 << 64))))
_SEQUENCE_ITERATORS = (*_RANGE_ITERATORS, type(iter(())), type(iter([])))
_GENERATOR = type((lambda: (yield))())
# CPython's frame layout (Include/internal/pycore_frame.h): offsets in _PyInterpreterFrame of its code
# object, of `stacktop` (the value stack's height, kept while the frame calls out) and of localsplus
_FRAME_LAYOUT = {(3, 11): (32, 64, 72), (3, 12): (0, 64, 72)}


def _range_iterator(frame: Any) -> Any:
    """The range iterator that a `for` loop of `frame` runs over (the innermost), itself or inside an
    enumerate, read from the frame's value stack; None where there is none or on another CPython."""
    return _loop_iterator(frame, _RANGE_ITERATORS)


def _sequence_iterator(frame: Any) -> Any:
    """As _range_iterator for a range, tuple or list iterator, or one that a generator on the
    frame's stack (a progress bar wrapping the sequence) loops over."""
    return _loop_iterator(frame, _SEQUENCE_ITERATORS, through_generators=True)


def _loop_iterator(frame: Any, kinds: tuple, through_generators: bool = False) -> Any:
    wanted = (*kinds, enumerate, _GENERATOR) if through_generators else (*kinds, enumerate)
    for obj in reversed(_value_stack(frame, wanted)):   # the innermost loop's iterator is the highest
        if isinstance(obj, enumerate):
            obj = next((o for o in gc.get_referents(obj) if isinstance(o, kinds)), None)
        elif isinstance(obj, _GENERATOR):
            inner = obj.gi_frame
            obj = None if inner is None or obj.gi_running else _loop_iterator(inner, kinds)
        if isinstance(obj, kinds):
            return obj
    return None


def _value_stack(frame: Any, types: tuple) -> list:
    """The objects of `types` (exactly) on a running or suspended frame's value stack (a loop's
    iterator is there while its body runs). CPython keeps no Python view of the stack, nor its
    height while the frame calls an object (a module) through C: the height before the call is
    worked out from the bytecode (_depth_at), the slots read through ctypes, and only an object
    whose type is one of those is taken."""
    layout = _FRAME_LAYOUT.get(sys.version_info[:2])
    if layout is None or sys.implementation.name != "cpython":
        return []
    import ctypes

    code_at, _, slots_at = layout
    word = ctypes.sizeof(ctypes.c_void_p)
    inner = ctypes.c_void_p.from_address(id(frame) + 3 * word).value   # PyFrameObject.f_frame
    code = frame.f_code
    if not inner or ctypes.c_void_p.from_address(inner + code_at).value != id(code):
        return []
    depth = _depth_at(code, frame.f_lasti)
    if depth is None or depth > code.co_stacksize:
        return []
    first = code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars)
    wanted = {id(t) for t in types}
    out = []
    for i in range(first, first + depth):
        p = ctypes.c_void_p.from_address(inner + slots_at + word * i).value
        if p and ctypes.c_void_p.from_address(p + word).value in wanted:   # ob_type
            out.append(ctypes.cast(p, ctypes.py_object).value)
    return out


_ENDS = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "RETURN_VALUE",
         "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}


@functools.lru_cache(maxsize=1024)   # asked at every step's end, of each frame between model and user
def _depth_at(code: Any, offset: int) -> int | None:
    """The value stack's height before the instruction at `offset`, by following the bytecode's flow
    from its start and from each exception handler (as the compiler computes co_stacksize)."""
    import dis

    instructions = list(dis.get_instructions(code))
    index = {ins.offset: k for k, ins in enumerate(instructions)}
    depth: dict[int, int] = {0: 0}
    for entry in getattr(dis.Bytecode(code), "exception_entries", ()):
        depth.setdefault(entry.target, entry.depth + 1 + int(entry.lasti))
    work = list(depth)
    while work:
        off = work.pop()
        k = index.get(off)
        if k is None:
            continue
        ins, d = instructions[k], depth[off]
        nexts = []
        if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            nexts.append((ins.argval, d + dis.stack_effect(ins.opcode, ins.arg, jump=True)))
        if ins.opname not in _ENDS and k + 1 < len(instructions):
            effect = dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=False)
            nexts.append((instructions[k + 1].offset, d + effect))
        for target, td in nexts:
            if target not in depth:
                depth[target] = td
                work.append(target)
    at = max((ins.offset for ins in instructions if ins.offset <= offset), default=None)   # f_lasti may
    return depth.get(at)   # point into the instruction's inline caches
