"""ResNet-50 v1.5 training steps on CPU with synthetic data, data parallel across processes.

The CPU check workload of the kit: the real model (bottleneck blocks with the stride on
the 3x3 convolution, as in v1.5), SGD with momentum, one process per node. Gradients are
all-reduced either by DistributedDataParallel over gloo (``--dist torch``, under torchrun)
or, Horovod-style, by one MPI Allreduce of the flattened gradients per step (``--dist mpi``,
under mpirun). Rank 0 logs in NVIDIA DeepLearningExamples' DLLogger text format so the
kit's ngc-pytorch parser and protocols apply unchanged.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                  *conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),  # v1.5: stride here
                                  *conv_bn(width, cout, 1))
        self.skip = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [*conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def allreduce_gradients(model: nn.Module, comm: object, world: int) -> None:
    """Average the gradients over the MPI ranks with one Allreduce of a flat buffer."""
    from mpi4py import MPI

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    buf = flat.numpy()
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # type: ignore[attr-defined]
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def dll(text: str) -> None:
    print(f"DLL {datetime.datetime.now():%Y-%m-%d %H:%M:%S.%f} - {text}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-b", "--batch-size", type=int, default=8, help="per process")
    ap.add_argument("--prof", type=int, default=30, help="training iterations")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dist", choices=["torch", "mpi"], default="torch", help="gloo DDP or MPI allreduce")
    args = ap.parse_args()

    comm = None
    if args.dist == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, world = comm.Get_rank(), comm.Get_size()
    distributed = args.dist == "torch" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    if comm is None:
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)
    model = resnet50()
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 1000, (args.batch_size,))
    if rank == 0:
        dll(f"PARAMETER data : synthetic  data_backend : synthetic  arch : resnet50  batch_size : {args.batch_size}  "
            f"image_size : {args.image_size}  prof : {args.prof}  amp : False  precision : {args.precision}  "
            f"torch : {torch.__version__}  threads : {torch.get_num_threads()}  world_size : {world} ")
        print("RUNNING EPOCHS FROM 0 TO 1", flush=True)
    total, losses = 0.0, []
    for it in range(1, args.prof + 1):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if comm is not None and world > 1:
            allreduce_gradients(model, comm, world)
        opt.step()
        elapsed = time.perf_counter() - start
        total += elapsed
        losses.append(loss.item())
        if rank == 0:
            dll(f"Epoch: 0 Iteration: {it}  train.loss : {loss.item():.5f} None "
                f"train.total_ips : {world * args.batch_size / elapsed:.2f} images/s")
    if rank == 0:
        dll(f"Summary: train.loss : {sum(losses) / len(losses):.5f} None "
            f"train.total_ips : {world * args.batch_size * args.prof / total:.2f} images/s")
    # data parallelism keeps every rank's weights identical; each rank prints its checksum
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"rank {rank} of {world}: parameter checksum {checksum:.10e}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
