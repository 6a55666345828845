#!/usr/bin/python3
"""One rank of `xagg train --backend ddp-*` (docs/training.md): the training of
trainer.cpp (same models, data, slices, SGD and JSON events) through
PyTorch's DistributedDataParallel instead of libxagg's own bucketing, so that
the paths users take are timed beside the C++ backends:

    ddp-xagg       DDP on the "xagg" process group (xagg_torch)
    ddp-hook       DDP on Gloo, its gradient buckets averaged through xagg_torch.allreduce_hook
    ddp-hook16     the same through xagg_torch.wire16_hook, on the 16-bit wire
    ddp-gloo       DDP on Gloo alone
    ddp-gloo-fp16  DDP on Gloo with torch's fp16_compress_hook (buckets sent as float16)

Started by the launcher in the rank's namespace with the run's TrainConfig as JSON.
"""
import argparse
import gzip
import json
import os
import sys
import time
from datetime import timedelta

import numpy
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel

import xagg_torch


def load_idx(path):
    """A gzip'd IDX file as a tensor (header: magic, then one big-endian int32 per dimension)."""
    with gzip.open(path) as file:
        data = file.read()
    dimensions = data[3]
    shape = numpy.frombuffer(data, dtype=">i4", count=dimensions, offset=4)
    return torch.from_numpy(numpy.frombuffer(data, dtype=numpy.uint8, offset=4 + 4 * dimensions).reshape(shape).copy())


def fashion_mnist(data_dir, split, limit):
    images = load_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")).long()
    count = len(images) if limit == 0 else min(limit, len(images))
    # Fashion-MNIST's training-set mean and standard deviation, as trainer.cpp.
    return images[:count].float().div(255).sub(0.2860).div(0.3530).unsqueeze(1), labels[:count]


def make_model(config):
    """trainer.cpp's make_model, layer for layer in the same order."""
    nn = torch.nn
    if config["model"] == "mlp":
        hidden = config["hidden"]
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10))


def evaluate(model, images, labels):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for begin in range(0, len(images), 1000):
            logits = model(images[begin:begin + 1000])
            loss += torch.nn.functional.cross_entropy(logits, labels[begin:begin + 1000], reduction="sum").item()
            correct += (logits.argmax(1) == labels[begin:begin + 1000]).sum().item()
    model.train()
    return 100.0 * correct / len(images), loss / len(images)


def emit(event):
    print(json.dumps(event), flush=True)


# The DDP backends (launcher.cpp's kDdpBackends): the process group DDP runs on and the comm hook
# that averages its buckets (None: the group's own all-reduce).
BACKENDS = {
    "ddp-xagg": ("xagg", None),
    "ddp-hook": ("gloo", xagg_torch.allreduce_hook),
    "ddp-hook16": ("gloo", xagg_torch.wire16_hook),
    "ddp-gloo": ("gloo", None),
    "ddp-gloo-fp16": ("gloo", fp16_compress_hook),
}
XAGG_HOOKS = (xagg_torch.allreduce_hook, xagg_torch.wire16_hook)


def connect(config, rank, parameters):
    """Joins the run's process groups; returns the comm hook for DDP and its state (the group it
    averages through: an xagg group of its own for xagg's hooks, None for DDP's group)."""
    store = dist.FileStore(os.path.join(config["rendezvous"], "ddp-store"), config["world_size"])
    timeout = timedelta(seconds=120)
    group_backend, hook = BACKENDS[config["backend"]]
    # wire16_hook's group is a 16-bit job, so that its buckets fill the packets (docs/protocol.md section 11).
    xagg_options = xagg_torch.Options(aggregators=config["servers"], job_id=config["job_id"], max_elements=parameters,
                                      root_aggregator=config["root_server"] or None,
                                      ranks_per_leaf=config["ranks_per_leaf"] or None,
                                      wire_bits=16 if hook is xagg_torch.wire16_hook else config["wire_bits"])
    dist.init_process_group(group_backend, store=store, rank=rank, world_size=config["world_size"], timeout=timeout,
                            pg_options=xagg_options if group_backend == "xagg" else None)
    if hook in XAGG_HOOKS:
        return hook, dist.new_group(backend="xagg", pg_options=xagg_options, timeout=timeout)
    return hook, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run's TrainConfig, JSON")
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args()
    config = json.loads(args.config)
    rank, world_size = args.rank, config["world_size"]
    if config["backend"] not in BACKENDS:
        sys.exit(f"ddp_worker: backend {config['backend']} is not a DDP backend")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the testbed namespace's link
    torch.set_num_threads(config["threads"])

    images, labels = fashion_mnist(config["data_dir"], "train", config["train_samples"])
    test = fashion_mnist(config["data_dir"], "t10k", config["test_samples"]) if rank == 0 else None
    torch.manual_seed(config["seed"])  # the same initial weights on every rank
    model = make_model(config)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    hook, hook_state = connect(config, rank, parameters)
    ddp = DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config["learning_rate"], momentum=config["momentum"])

    global_batch = config["batch_size"]
    local_batch = global_batch // world_size
    steps = len(images) // global_batch
    skew = config["compute_skew"][rank] if config["compute_skew"] else 1.0
    # DDP's backward waits for its all-reduces, so a step's compute time is measured once,
    # without communication, on a batch whose gradient is thrown away.
    compute_seconds = 0.0
    if skew > 1.0:
        with ddp.no_sync():
            begin = time.perf_counter()
            torch.nn.functional.cross_entropy(ddp(images[:local_batch]), labels[:local_batch]).backward()
            compute_seconds = time.perf_counter() - begin
        optimizer.zero_grad()
    emit({"event": "start", "rank": rank, "steps_per_epoch": steps, "parameters": parameters,
          "buckets": None, "train_samples": len(images)})
    start = time.perf_counter()
    training_seconds = 0.0
    for epoch in range(1, config["epochs"] + 1):
        # Every rank draws the same permutation and takes its slice of each global batch.
        order = torch.randperm(len(images))
        loss_sum, step_seconds = 0.0, 0.0
        for step in range(steps):
            step_start = time.perf_counter()
            indexes = order[step * global_batch + rank * local_batch:][:local_batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(images[indexes]), labels[indexes])
            if skew > 1.0:
                time.sleep((skew - 1.0) * compute_seconds)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            step_seconds += time.perf_counter() - step_start
            if (step + 1) % config["progress_every"] == 0 or step + 1 == steps:
                emit({"event": "progress", "epoch": epoch, "step": step + 1, "steps": steps,
                      "loss": loss_sum / (step + 1), "iteration_ms": 1e3 * step_seconds / (step + 1),
                      "comm_share": 0.0})
            if test and config["eval_every"] > 0 and (step + 1) % config["eval_every"] == 0 and step + 1 < steps:
                accuracy, test_loss = evaluate(model, *test)
                emit({"event": "evaluation", "epoch": epoch, "step": step + 1, "test_accuracy": accuracy,
                      "test_loss": test_loss, "wall_s": time.perf_counter() - start})
        training_seconds += step_seconds
        # DDP overlaps its all-reduces with backward and waits inside it: the
        # communication time is not observable from here, so it is reported as 0.
        summary = {"event": "epoch", "epoch": epoch, "train_loss": loss_sum / steps,
                   "iteration_ms": 1e3 * step_seconds / steps, "comm_share": 0.0, "exposed_comm_share": 0.0,
                   "train_s": training_seconds}
        if test:
            summary["test_accuracy"], summary["test_loss"] = evaluate(model, *test)
        summary["wall_s"] = time.perf_counter() - start
        emit(summary)
    emit({"event": "done", "wall_s": time.perf_counter() - start})
    # Rank 0 evaluates while the others would already tear their process
    # groups down: every rank finishes before any does.
    dist.barrier()
    dist.destroy_process_group()
    # Everything is written (emit flushes); leave without the interpreter's
    # teardown, whose joins of torch's and Gloo's threads have no time limit.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
