"""A library that defines a torch operator at import, as torchao does (a module-level
`torch.library.Library("torchao", "FRAGMENT")` and its fake kernel): the fake kernel, held by
torch's registry, holds this module's globals and so the Library, which therefore never dies by
itself. Each rank that imports it afresh must find the operator undefined. Used by dist_ops.py and
agent_launcher.py (tests/test_predict_spawn.py)."""
import torch

lib = torch.library.Library("amem_test_ops", "FRAGMENT")
lib.define("doubled(Tensor a) -> Tensor")


@torch.library.register_fake("amem_test_ops::doubled", lib=lib)
def _doubled_fake(a):
    return torch.empty_like(a)


@torch.library.impl(lib, "doubled", "CompositeExplicitAutograd")
def _doubled(a):
    return a * 2
