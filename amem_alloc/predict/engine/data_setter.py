"""`tensor.data = other` and `tensor.grad = other` across the host and the fake device.

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

`.grad =` checks that the gradient's device type is the tensor's, and a host copy of a fake tensor
is a meta tensor that answers "cpu": DeepSpeed's CPU optimizer offload gives such a copy of its
flat partition a real host gradient (`torch.zeros(..., device="cpu")`). Where both answer the same
device, the gradient is made like the tensor: a fake copy of a real gradient, or the real value of
a fake one (its known value, else zeros: host values are no GPU memory). Devices that differ are
refused with torch's own message, naming the devices the program sees.
"""
from __future__ import annotations

import torch

from ..notes import NotModelledError, call_site
from .devices import META, OnDevice

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


def set_grad(func, args, kwargs, device_of, known_value):
    """The `Tensor.grad` setter under prediction (see the design note); `device_of(t)`: the device
    type `t` answers, `known_value(t)`: a fake tensor's real value, or None."""
    target, grad = args
    if grad is None or not (target.is_meta or grad.is_meta):
        return func(*args, **kwargs)
    device, grad_device = device_of(target), device_of(grad)
    if device != grad_device:
        raise RuntimeError(f"attempting to assign a gradient with device type '{grad_device}' to a tensor with "
                           f"device type '{device}'. Please ensure that the gradient and the tensor are on the "
                           f"same device")
    if target.is_meta == grad.is_meta:
        return func(*args, **kwargs)
    if target.is_meta:
        with OnDevice(device):
            grad = torch.Tensor.to(grad, device=META, copy=True)
    else:
        value = known_value(grad)
        grad = value.clone() if value is not None else torch.zeros(grad.shape, dtype=grad.dtype, device="cpu")
    return func(target, grad, **kwargs)
