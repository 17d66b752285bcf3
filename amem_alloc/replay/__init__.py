"""Replay: recorded allocation sequences run through the C++ core on the sim backend, per policy.

    program.py   the program format (packed requests), a torch snapshot turned into programs,
                 and running one program under one configuration (the C++ loop)
    evaluation.py  one program under several policies (evaluate): peaks, fragmentation, the
                 smallest capacity, fits; the one row (PolicyRow) and table cells that amem
                 replay, amem compare and amem predict print
    trace.py     `amem replay`: every device of a trace evaluated under several policies, with
                 the capacity it assumes and the native figures (replay_trace)
    traced.py    a program re-run with the core's trace on (the C++ loop's traced variant), as
                 torch's snapshot: a prediction's trace (traced_snapshot)

Prediction (amem_alloc.predict) and amem compare produce programs too; everything after the
program is this package's.
"""
from .program import (ALLOC, CORE_KINDS, DEVICE_COUNTERS, FREE, MIN_BLOCK, OPS, POOL_BEGIN, POOL_END, POOL_RELEASE,
                      PROLOGUE_END, RELEASE,
                      RELEASE_ACTIONS, SEGMENT_ACTIONS, SMALL_REQUEST, SMALL_SEGMENT, TEMP_KEY, Native, Program, Run,
                      TraceProgram, final_segments, pack, program_from_events, replay_program, run, segment_layouts,
                      trace_program, trace_programs)

__all__ = ["ALLOC", "CORE_KINDS", "DEVICE_COUNTERS", "FREE", "MIN_BLOCK", "OPS", "POOL_BEGIN", "POOL_END",
           "POOL_RELEASE", "PROLOGUE_END", "RELEASE",
           "RELEASE_ACTIONS", "SEGMENT_ACTIONS", "SMALL_REQUEST", "SMALL_SEGMENT", "TEMP_KEY", "Native", "Program",
           "Run", "TraceProgram", "final_segments", "pack", "program_from_events", "replay_program", "run",
           "segment_layouts", "trace_program", "trace_programs"]
