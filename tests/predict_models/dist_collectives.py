"""Every kind of collective once, on tensors of distinct sizes so a test can find each allocation:
KiB marks the step (901-913); tests/test_predict_distributed.py checks what NCCL's rules allocate and hold.
Run per rank under `amem predict --nproc-per-node 4`."""
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()


def kib(n):
    """A float32 CUDA tensor of n KiB."""
    return torch.empty(n * 256, device="cuda")


def mark(n):
    """An allocation of n KiB that only marks a point of the program (freed at once)."""
    kib(n)


a = kib(11)
dist.all_reduce(a)                          # synchronous: current stream, nothing held
del a
mark(901)
b = kib(13)
work = dist.all_reduce(b, async_op=True)    # asynchronous: b is held for the NCCL stream
del b
mark(902)                                   # b's free still held here
work.wait()                                 # the current stream waits for the NCCL stream
del work                                    # the work held b too (WorkNCCL's outputs): now freed
mark(903)
parts = [kib(17) for _ in range(world)]
dist.all_gather(parts, kib(17))             # list form: one flat buffer of world x 17 KiB for the call
del parts
mark(904)
out = kib(19)
dist.reduce_scatter(out, [kib(19) for _ in range(world)])   # list form: flat buffer of world x 19 KiB
del out
mark(905)
gathered = funcol.all_gather_tensor(kib(23), 0, list(range(world)))   # functional: output allocated
mark(911)                                   # its input still held for the NCCL stream here
gathered = funcol.wait_tensor(gathered)
del gathered
mark(906)
c = kib(29)
dist.broadcast(c, src=0)
swapped = torch.empty_like(c)
dist.all_to_all_single(swapped, c)
del c, swapped
mark(907)
peer = (dist.get_rank() + 1) % world
send, recv = kib(31), kib(37)
works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, (peer - 1) % world)])
del send, recv
mark(908)                                   # both held for the NCCL stream until waited
for w in works:
    w.wait()
mark(909)
d = kib(41)
w1 = dist.all_reduce(d, async_op=True)
w1.wait()
del w1
e = kib(43)
w2 = dist.all_reduce(e, async_op=True)      # queued on the NCCL stream after d's all-reduce
del d                                       # so d's free waits for it
mark(912)
w2.wait()
del w2, e                                   # the stream has nothing queued: e freed at once
mark(913)
dist.destroy_process_group()
