"""A launcher that starts torchrun's agent in its own process, as `tune run --nproc_per_node N`
does: torchrun's own parser and `torch.distributed.run.run(args)`, here on dist_ops.py with the
processes per node given first (`agent_launcher.py 2`). It imports the script's operator library
first, as tune imports torchao before it launches. Predicted by tests/test_predict_spawn.py."""
import os
import sys

from torch.distributed.run import get_args_parser, run

import op_library  # noqa: F401

script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_ops.py")
run(get_args_parser().parse_args(["--standalone", "--nproc-per-node", sys.argv[1], script]))
