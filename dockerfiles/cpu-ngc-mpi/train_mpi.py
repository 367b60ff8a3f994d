"""A training-shaped MPI program for the kit's CPU check of the mpi launcher.

It takes the flags of an NGC TensorFlow 1 ConvNets run (``main.py --mode=training_benchmark
--warmup_steps N --num_iter N --iter_unit batch --batch_size N ...``), averages a
"gradient" over the ranks with one MPI Allreduce per step as Horovod does, and prints
per-step throughput. Every rank also reports where it runs and what it found of the
image's environment, so a test can tell that ranks started through sshd got it.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="training_benchmark")
    ap.add_argument("--warmup_steps", type=int, default=2)
    ap.add_argument("--num_iter", type=int, default=6)
    ap.add_argument("--iter_unit", default="batch")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--results_dir", default="/tmp/result")
    ap.add_argument("--use_xla", action="store_true")
    ap.add_argument("--use_tf_amp", action="store_true")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    print(f"rank {rank} of {size} on {socket.gethostname()}: PATH={os.environ.get('PATH', '')} "
          f"OPAL_PREFIX={os.environ.get('OPAL_PREFIX', '')} MPI={MPI.Get_library_version().split(',')[0]}",
          flush=True)
    grad = np.full(1 << 16, float(rank + 1))
    for step in range(args.num_iter):
        started = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        grad /= size
        elapsed = time.perf_counter() - started
        if rank == 0 and step >= args.warmup_steps:
            print(f"step {step}: total_ips {args.batch_size * size / max(elapsed, 1e-9):.1f}", flush=True)
    expect = (size + 1) / 2  # the first step averages 1..size; later steps average equal values
    print(f"rank {rank}: gradient mean {grad.mean():.4f} (expected {expect:.4f})", flush=True)


if __name__ == "__main__":
    main()
