"""`amem doctor`: what is installed and usable (amem_alloc/doctor.py does the checking); with
--calibrate, the device memory outside torch's allocator measured on this GPU (amem_alloc/calibration.py)."""
from __future__ import annotations

import argparse
from pathlib import Path


def command(args: argparse.Namespace) -> int:
    if args.calibrate:
        from .. import calibration

        return calibration.calibrate(args.calibration_file)
    from .. import doctor

    return doctor.main()


def add(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser("doctor", help="what is installed, which torch, whether the start-up hook (AMEM_ENABLE, "
                         "AMEM_TRACE) is active, and whether a GPU and its virtual memory management are usable")
    doc.add_argument("--calibrate", action="store_true",
                     help="on an idle GPU: measure the CUDA context and the libraries' memory outside torch's "
                          "allocator (lazy and eager loading, cuBLAS, cuDNN, NCCL) and save it for predictions")
    doc.add_argument("--calibration-file", type=Path, default=None, metavar="FILE",
                     help="where --calibrate saves (default: $AMEM_CALIBRATION, else "
                          "~/.cache/amem_alloc/calibration.json)")
    doc.set_defaults(func=command)
