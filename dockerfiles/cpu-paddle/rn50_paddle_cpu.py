"""ResNet-50 v1.5 training steps on CPU with synthetic data, data-parallel over gloo, for Paddle.

The Paddle CPU check workload of the kit. It runs under ``python -m paddle.distributed.launch
--ips=a,b``: the same command on every node, the launcher finding the node's rank from its
address and passing it on in PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM; without the launcher it
runs alone. The model is paddle.vision's resnet50 (checked at start to be v1.5: the stride of
a downsampling bottleneck sits on its 3x3 convolution), trained with Momentum SGD and L2 decay
on one fixed batch of random images.

Rank 0 writes the log lines the kit's paddleclas parser reads (PaddleClas' static engine): a
config dump whose keys give the facts (per-process batch size, no AMP section: FP32), then per
print step ``epoch:0   train step:N   ... ips: X samples/sec.``, where ips is per process and
is the batch size over the mean time of the steps after the fifth, as PaddleClas computes it. Every rank
prints which rank it is and where that came from, and a parameter checksum at the end (data
parallelism keeps the replicas identical).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import time

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.vision.models import resnet50

#: what paddle.distributed.launch hands each process; PADDLE_TRAINERS_NUM also tells the parser
#: how many processes ("GPUs") the per-process ips figures stand for
DIST_ENV = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ENDPOINTS",
            "PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_DISTRI_BACKEND", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")

#: the step (0-based) at which the step-time meter restarts, as PaddleClas' meters do after warm-up
WARMUP_STEPS = 5


def log(text: str) -> None:
    for line in text.splitlines():
        print(f"[{datetime.datetime.now():%Y/%m/%d %H:%M:%S}] ppcls INFO: {line}", flush=True)


def config_dump(cfg: dict, indent: int = 0) -> str:
    """``key : value`` lines, sections as ``name : `` with their keys indented by 4 more spaces."""
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            out.append(f"{' ' * indent}{key} : ")
            out.append(config_dump(value, indent + 4))
        else:
            out.append(f"{' ' * indent}{key} : {value}")
    return "\n".join(out)


def v15_stride(model: nn.Layer) -> str:
    """Where the first downsampling bottleneck (layer2[0]) puts its stride: '3x3' is v1.5, '1x1' v1."""
    block = model.layer2[0]
    if list(block.conv2._stride) == [2, 2] and list(block.conv1._stride) == [1, 1]:
        return "3x3"
    return "1x1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-b", "--batch-size", type=int, default=8, help="per process")
    ap.add_argument("--steps", type=int, default=30, help="training steps")
    ap.add_argument("--print-step", type=int, default=1, help="log every N steps (PaddleClas print_batch_step)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32"], default="fp32")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    paddle.set_device("cpu")
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    endpoint = os.environ.get("PADDLE_CURRENT_ENDPOINT", "none")
    # every node says which rank the launcher gave it, and what with, before any collective call,
    # so a wrong rank shows in the log even when the rendezvous then hangs; the launcher derived
    # it from finding this node's address in --ips (PADDLE_CURRENT_ENDPOINT is that address)
    print(f"rank {rank} of {world} on {socket.gethostname()}, endpoint {endpoint}", flush=True)
    for name in DIST_ENV:
        print(f"distributed env: {name:<26} {os.environ.get(name, '-')}", flush=True)
    if world > 1:
        dist.init_parallel_env()
        rank, world = dist.get_rank(), dist.get_world_size()

    paddle.seed(args.seed)
    np.random.seed(args.seed)
    model = resnet50(num_classes=1000)
    stride_on = v15_stride(model)
    if stride_on != "3x3":
        raise SystemExit("paddle.vision resnet50 is not v1.5 here: its downsampling stride is on the 1x1 conv")
    if world > 1:
        model = paddle.DataParallel(model)
    opt = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters(),
                                    weight_decay=paddle.regularizer.L2Decay(1e-4))
    loss_fn = nn.CrossEntropyLoss()
    images = paddle.to_tensor(np.random.randn(args.batch_size, 3, args.image_size, args.image_size).astype("float32"))
    labels = paddle.to_tensor(np.random.randint(0, 1000, (args.batch_size, 1)).astype("int64"))

    if rank == 0:
        log(config_dump({
            "Global": {"device": "cpu", "epochs": 1, "print_batch_step": args.print_step, "seed": args.seed,
                       "image_shape": f"[3, {args.image_size}, {args.image_size}]", "world_size": world,
                       "paddle_version": paddle.__version__, "threads": os.environ.get("OMP_NUM_THREADS", "default")},
            "Arch": {"name": "ResNet50", "class_num": 1000, "data_format": "NCHW",
                     "downsample_stride_on": stride_on},
            "Loss": {"Train": {"CELoss": {"weight": 1.0}}},
            "Optimizer": {"name": "Momentum", "momentum": 0.9, "lr": {"learning_rate": 0.1},
                          "regularizer": {"name": "L2", "coeff": 0.0001}},
            "DataLoader": {"Train": {"dataset": {"name": "synthetic"},
                                     "sampler": {"batch_size": args.batch_size, "drop_last": False},
                                     "loader": {"num_workers": 0}}},
        }))

    model.train()
    batch_costs: list[float] = []
    for step in range(args.steps):
        start = time.perf_counter()
        reader_cost = time.perf_counter() - start  # the batch is already in memory
        loss = loss_fn(model(images), labels)
        loss.backward()
        opt.step()
        opt.clear_grad()
        loss_value = float(loss)  # waits for the step, as PaddleClas' fetch does
        cost = time.perf_counter() - start
        if step == WARMUP_STEPS:
            batch_costs.clear()
        batch_costs.append(cost)
        if rank == 0 and (step + 1) % args.print_step == 0:
            mean_cost = sum(batch_costs) / len(batch_costs)
            log(f"epoch:0   train step:{step + 1}   lr: {opt.get_lr():.6f}, loss: {loss_value:.4f} "
                f"batch_cost: {mean_cost:.5f} s, reader_cost: {reader_cost:.5f} s, "
                f"ips: {args.batch_size / mean_cost:.5f} samples/sec.")

    params = model.parameters()
    checksum = sum(float(p.astype("float64").sum()) for p in params)
    print(f"rank {rank} of {world}: parameter checksum {checksum:.10e}", flush=True)


if __name__ == "__main__":
    main()
