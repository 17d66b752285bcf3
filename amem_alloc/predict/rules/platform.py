"""What the kernel rules need to know about the predicted card and the installed torch and cuDNN.

Design note
-----------
CUDA kernels choose paths from the device (compute capability, SM count) and from the libraries
the process loaded (cuDNN's runtime version, the CUDA version torch was built with, torch's own
release). A prediction has no device, so the card is the session's (FakeCudaSession.capability
and the card table's SM count), and the libraries are the ones installed here: torch reports
cuDNN's runtime version and its CUDA version without a GPU. `of(session)` gathers them once per
session. The SM count is the session's `multi_processor_count` where it has one, else the card
table's entry for the session's device name.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from functools import lru_cache

import torch

DEFAULT_SMS = 132   # an H100 SXM: the default card


@dataclass(frozen=True)
class Platform:
    capability: tuple[int, int]   # the card's (major, minor)
    sm_count: int                 # cudaDeviceProp::multiProcessorCount
    cudnn_version: int            # cudnnGetVersion() of the loaded cuDNN, e.g. 92400; 0 without cuDNN
    cuda_version: int             # CUDA_VERSION torch was built with, e.g. 13000
    torch_version: tuple[int, int]

    @property
    def major(self) -> int:
        return self.capability[0]

    @property
    def minor(self) -> int:
        return self.capability[1]


@lru_cache(maxsize=None)
def libraries() -> tuple[int, int, tuple[int, int]]:
    try:
        cudnn = int(torch.backends.cudnn.version() or 0) if torch.backends.cudnn.is_available() else 0
    except Exception:   # a CPU-only build, or a cuDNN that cannot be loaded
        cudnn = 0
    cuda = torch.version.cuda or "0.0"
    major, minor = (int(x) for x in cuda.split(".")[:2])
    release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    return cudnn, major * 1000 + minor * 10, release


def sm_count(session) -> int:
    """The card's SM count: the session's, else the card table's entry for its name, else an H100's."""
    sms = getattr(session, "multi_processor_count", None)
    if sms:
        return int(sms)
    from ..gpus import GPUS
    name = getattr(session, "device_name", None)
    for gpu in GPUS.values():
        if gpu.name == name:
            return gpu.multi_processor_count
    return DEFAULT_SMS


_of_session: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def of(session) -> Platform:
    """The session's platform, gathered on first use."""
    found = _of_session.get(session)
    if found is None:
        cudnn, cuda, release = libraries()
        found = _of_session[session] = Platform(tuple(session.capability), sm_count(session), cudnn, cuda, release)
    return found
