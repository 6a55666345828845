#!/usr/bin/python3
"""Data-parallel training of torchvision's ResNet-18 (random init) on
Fashion-MNIST with DistributedDataParallel over XAgg. Start one process per
rank with torchrun (docs/pytorch.md):

    XAGG_AGGREGATOR=198.18.0.1 torchrun --nnodes 2 --node_rank R --nproc_per_node 1 \
        --master_addr 198.18.1.1 --master_port 29500 examples/resnet18_ddp.py --steps 50

--mode backend: the "xagg" process group carries everything (default).
--mode hook:    DDP keeps Gloo; gradient buckets go through xagg_torch.allreduce_hook.
--mode gloo:    plain Gloo, for comparison.
"""
import argparse
import gzip
import os
import time

import numpy
import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel

import xagg_torch

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(name):
    """A gzip'd IDX file as a tensor (header: magic, then one big-endian int32 per dimension)."""
    with gzip.open(os.path.join(DATA, name + ".gz")) as file:
        data = file.read()
    dimensions = data[3]
    shape = numpy.frombuffer(data, dtype=">i4", count=dimensions, offset=4)
    return torch.from_numpy(numpy.frombuffer(data, dtype=numpy.uint8, offset=4 + 4 * dimensions).reshape(shape).copy())


def fashion_mnist(split):
    images = load_idx(f"{split}-images-idx3-ubyte").float().div(255).sub(0.2860).div(0.3530).unsqueeze(1)
    return images, load_idx(f"{split}-labels-idx1-ubyte").long()


def main():
    parser = argparse.ArgumentParser(description="ResNet-18 DDP through XAgg")
    parser.add_argument("--mode", choices=["backend", "hook", "gloo"], default="backend")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dist.init_process_group("xagg" if args.mode == "backend" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)  # grayscale input
    ddp = DistributedDataParallel(model)
    if args.mode == "hook":
        ddp.register_comm_hook(dist.new_group(backend="xagg"), xagg_torch.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    images, labels = fashion_mnist("train")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    for step in range(args.steps):
        begin = (step * world_size + rank) * args.batch_size  # each rank its own slice of the global batch
        indexes = order[begin:begin + args.batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(images[indexes]), labels[indexes])
        loss.backward()
        optimizer.step()
        if rank == 0 and (step + 1) % 10 == 0:
            elapsed = time.perf_counter() - start
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f} {1e3 * elapsed / (step + 1):.0f} ms/step",
                  flush=True)

    if rank == 0:
        test_images, test_labels = fashion_mnist("t10k")
        ddp.eval()
        with torch.no_grad():
            predictions = torch.cat([ddp.module(batch).argmax(1) for batch in test_images[:2000].split(500)])
        print(f"test accuracy on 2000 images: {100 * (predictions == test_labels[:2000]).float().mean():.2f}%")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
