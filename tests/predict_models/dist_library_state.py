"""Each rank initialises a library that keeps per-process state (stateful_library/, beside this
script) and checks that it found none: under torchrun every rank is a new process. One Linear step
so the rank has a program."""
import logging
import sys

import sympy  # noqa: F401 - a distribution torch needs: it stays loaded across ranks
import torch
import torch.distributed as dist

import stateful_library

dist.init_process_group("nccl")
rank = dist.get_rank()
handlers = logging.getLogger("stateful_library").handlers
if len(handlers) != 1:
    sys.exit(f"rank {rank}: the library's logger has {len(handlers)} handlers")
stateful_library.init(rank)
model = torch.nn.Linear(64, 64).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(8, 64, device="cuda")).sum().backward()
optimizer.step()
