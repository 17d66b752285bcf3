"""`tensor.data = other` across the host and the fake device.

Design note
-----------
On a GPU, `buffer.data = buffer.to("cuda")` moves a tensor in place: the Python object keeps its
identity (a module's buffer, a parameter an optimizer holds) and takes the new data. FSDP2 moves a
model's buffers so when it does not load them itself (`fsdp_cpu_ram_efficient_loading: false` in
accelerate), and offloading code does the reverse. torch allows `.data =` between tensors of
"compatible shallow-copy types": CPU and CUDA tensors are, but a fake CUDA tensor is a meta one,
and meta and CPU tensors are not, so torch refused the call and stopped the script.

Between a real host tensor and a fake one, the object is given the new data the way torch's own
`swap_tensors` rebinds a module's parameters (`torch.__future__.set_swap_module_params_on_conversion`):
a fresh tensor of the object's class over `other`'s storage, with the object's `requires_grad`,
attributes and gradient, swapped into the object. What torch cannot swap (a tensor with weak
references, or held by views and graphs) is amem's stated limit, said in one line at the user's
line.
"""
from __future__ import annotations

import torch

from ..notes import NotModelledError, call_site

CANNOT_SWAP = ("`.data =` moving a tensor between the host and the GPU, which amem models by rebinding the "
               "tensor object, and torch cannot rebind this one ({why}); move it with `t = t.to(...)` instead")


def set_data(func, args, kwargs):
    """The `Tensor.data` setter under prediction (see the design note)."""
    target, new = args
    if torch._has_compatible_shallow_copy_type(target, new):
        return func(*args, **kwargs)
    rebound = torch.Tensor._make_subclass(type(target), new, target.requires_grad)
    rebound.__dict__.update(target.__dict__)
    grad = target.grad
    try:
        torch.utils.swap_tensors(target, rebound)
    except RuntimeError as e:
        raise NotModelledError(CANNOT_SWAP.format(why=str(e).split(" make sure")[0]), call_site(2)) from None
    if grad is not None and torch._has_compatible_shallow_copy_type(target, grad):
        target.grad = grad
    return None
