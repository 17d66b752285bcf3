"""CUDA random generators under prediction: `torch.cuda.default_generators` (one per device) and
`torch.Generator(device="cuda")` are fake ones.

Design note
-----------
A CUDA generator is a seed and a philox offset (CUDAGeneratorImpl's state: 16 bytes); torch's
would ask the driver, and `torch.cuda.default_generators` is empty where no GPU was found, so
programs that keep their own RNG streams (Megatron's tensor-parallel RNG tracker reads and sets
the default generators' states; a data pipeline seeds its own CUDA generator) would fail as if by
their own fault. The fake one is a real torch Generator (a CPU one underneath, so torch's argument
parser takes it wherever an op accepts `generator=`) that says it is on CUDA and keeps the seed and
offset a program sets: get_state / set_state, graph-safe states and clones answer from those.
Fake tensors hold no values, so nothing is drawn from it.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import torch

from ..failures import stand_in
from .devices import _device_index

_STATE_BYTES = 16   # CUDAGeneratorImpl::get_state: seed (8 bytes), then the philox offset (8 bytes)
_DEFAULT_SEED = 67280421310721   # c10::default_rng_seed_val


@stand_in
class FakeCudaGenerator(torch._C.Generator):
    """A CUDA device's generator: its seed and offset, nothing drawn."""

    def __new__(cls, index: int = 0) -> "FakeCudaGenerator":
        generator = super().__new__(cls, device="cpu")
        generator.index, generator.seed_value, generator.offset = index, _DEFAULT_SEED, 0
        return generator

    def __init__(self, index: int = 0) -> None:   # (torch's __init__ would take `device` again)
        pass

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def manual_seed(self, seed: int) -> "FakeCudaGenerator":
        self.seed_value, self.offset = int(seed) & ((1 << 64) - 1), 0
        return self

    def seed(self) -> int:
        """A non-deterministic seed, as CUDA's (the CPU generator's stream is left alone)."""
        self.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        return self.seed_value

    def initial_seed(self) -> int:
        return self.seed_value

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> "FakeCudaGenerator":
        self.offset = int(offset)
        return self

    def get_state(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(struct.pack("<QQ", self.seed_value, self.offset)), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> "FakeCudaGenerator":
        data = new_state.detach().cpu().to(torch.uint8).numpy().tobytes() if isinstance(new_state, torch.Tensor) else b""
        if len(data) != _STATE_BYTES:
            raise RuntimeError(f"RNG state is wrong size: a CUDA generator's state is {_STATE_BYTES} bytes, "
                               f"{len(data)} given")
        self.seed_value, self.offset = struct.unpack("<QQ", data)
        return self

    def clone_state(self) -> "FakeCudaGenerator":
        return FakeCudaGenerator(self.index).graphsafe_set_state(self)

    def graphsafe_get_state(self) -> "FakeCudaGenerator":
        return self.clone_state()

    def graphsafe_set_state(self, state: Any) -> "FakeCudaGenerator":
        self.seed_value, self.offset = state.seed_value, state.offset
        return self

    def __repr__(self) -> str:
        return f"<torch._C.Generator object on cuda:{self.index} [predicted: no GPU]>"


class _GeneratorKind(type):
    """torch.Generator under prediction: one made for a CUDA device is the fake one, any other
    torch's own (a generator's device is the CPU unless told). isinstance accepts both."""

    def __call__(cls, device: Any = "cpu") -> Any:
        target = torch.device(device) if not isinstance(device, torch.device) else device
        if target.type != "cuda":
            return cls.real(device)
        return FakeCudaGenerator(_device_index(target))

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.real)


def generator_class() -> type:
    """The stand-in for torch.Generator."""
    return _GeneratorKind("Generator", (), {"real": torch._C.Generator, "__module__": "torch"})


def default_generators(device_count: int) -> tuple:
    """torch.cuda.default_generators: one fake generator per device."""
    return tuple(FakeCudaGenerator(index) for index in range(device_count))


class CudaGenerators:
    """torch.cuda's seeding and RNG-state functions, answered from the devices' default generators:
    a seed set is the seed read back; a state read is the seed and the offset as set (the offset
    does not advance as ops draw: nothing is drawn), which the prediction's notes say."""

    def __init__(self, device_count: int) -> None:
        self.default_generators = default_generators(device_count)

    def table(self) -> dict[str, Any]:
        """torch.cuda's names for them."""
        names = ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
                 "get_rng_state_all", "set_rng_state", "set_rng_state_all")
        return {"default_generators": self.default_generators, **{name: getattr(self, name) for name in names}}

    def _of(self, device: Any = None) -> FakeCudaGenerator:
        return self.default_generators[_device_index(device)]

    def manual_seed(self, seed: int) -> None:
        self._of().manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        for generator in self.default_generators:
            generator.manual_seed(seed)

    def seed(self) -> None:
        self._of().seed()

    def seed_all(self) -> None:
        seed = self._of().seed()
        for generator in self.default_generators:
            generator.manual_seed(seed)

    def initial_seed(self) -> int:
        return self._of().initial_seed()

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        from .. import notes

        notes.record(notes.STAND_IN, STATE_READ)
        return self._of(device).get_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        from .. import notes

        notes.record(notes.STAND_IN, STATE_SET)
        self._of(device).set_state(new_state)

    def get_rng_state_all(self) -> list:
        return [self.get_rng_state(index) for index in range(len(self.default_generators))]

    def set_rng_state_all(self, new_states: Any) -> None:
        for index, new_state in enumerate(new_states):
            self.set_rng_state(new_state, index)


STATE_READ = ("torch.cuda.get_rng_state(): the generator's seed and offset as set (its offset does not advance "
              "as ops draw: no generator runs)")
STATE_SET = "torch.cuda.set_rng_state(): kept as the generator's seed and offset (no generator runs)"
