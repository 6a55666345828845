#!/usr/bin/python3
"""Test accuracy vs wall-clock time, one line per `xagg train --log` JSON log.

    /usr/bin/python3 python/plot_training.py --output accuracy.png xagg.json tcp-ps.json
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="PNG to write")
    parser.add_argument("--title", default="Fashion-MNIST, data-parallel training")
    parser.add_argument("logs", nargs="+", help="JSON logs of xagg train")
    args = parser.parse_args()

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for path in args.logs:
        with open(path) as file:
            log = json.load(file)
        config = log["config"]
        label = f'{config["backend"]}, {log["workers"]} worker{"s" if log["workers"] > 1 else ""}'
        # Start at the untrained model's chance accuracy, at time zero; then every
        # evaluation within an epoch (--eval-every) and at each epoch's end.
        points = sorted((point["wall_s"], point["test_accuracy"]) for point in log["evaluations"] + log["epochs"])
        times = [0.0] + [time for time, _ in points]
        accuracies = [10.0] + [accuracy for _, accuracy in points]
        axes.plot(times, accuracies, marker="o", markersize=3, label=label)
    axes.set_xlabel("wall-clock time (s)")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(args.title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)


if __name__ == "__main__":
    main()
