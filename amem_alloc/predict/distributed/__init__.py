"""Distributed training under prediction: torchrun's ranks on torch's fake process group.

launch.py (the job's shape, torchrun's command line), environment.py (what torchrun sets per
rank), process_group.py (init_process_group on the fake backend), collectives.py (what NCCL
holds and allocates), ranks.py (each rank predicted, equal programs once), recording.py (a
rank's recorded program; ranks recorded in forked workers), per_rank.py (the
answer per rank), cli.py (`amem predict --nproc-per-node N ...` / `-- torchrun ...`).
"""
from .launch import Launch, parse_torchrun
from .per_rank import RankPrediction, RankResult
from .ranks import predict_ranks

__all__ = ["Launch", "RankPrediction", "RankResult", "parse_torchrun", "predict_ranks"]
