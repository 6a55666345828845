"""What every rank script of these tests shares: its place on the testbed
(command line) and the environment of torch.distributed and xagg_torch."""
import argparse
import os
import sys

import torch


def parse_args(add_arguments):
    """Parses the testbed arguments plus the script's own (add_arguments(parser))
    and sets the rendezvous and aggregator environment from them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master", required=True, help="rank 0's address (TCPStore)")
    parser.add_argument("--aggregator", required=True)
    add_arguments(parser)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR=args.master, MASTER_PORT="29500", XAGG_AGGREGATOR=args.aggregator,
                      GLOO_SOCKET_IFNAME="eth0")
    torch.set_num_threads(1)
    return args


def exit_with(rank, failures, success):
    """Prints each failure and the verdict, and exits 1 if anything failed."""
    for failure in failures:
        print(f"rank {rank}: FAILED {failure}", flush=True)
    print(f"rank {rank}: {'FAILED' if failures else success}", flush=True)
    sys.exit(1 if failures else 0)
