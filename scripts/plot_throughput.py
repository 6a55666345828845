#!/usr/bin/python3
"""Plots algbw against all-reduce size for each system of `xagg bench throughput --json FILE`.

usage: plot_throughput.py FIGURES.json OUT.png   (Debian's python3-matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on the benchmark machines
import matplotlib.pyplot as plt


def main(figures_path, png_path):
    with open(figures_path) as figures_file:
        figures = json.load(figures_file)
    setups = {result["setup"] for result in figures["results"]}
    systems = {}  # one line per system, and per setup (layout and MTU) when there are several
    for result in figures["results"]:
        if result["algbw_bytes_per_s"] is None:
            continue  # failed: a rank reported no time
        name = result["system"] if len(setups) == 1 else f"{result['system']} ({result['setup']})"
        systems.setdefault(name, []).append((result["bytes"], result["algbw_bytes_per_s"] / 1e9))
    fig, axes = plt.subplots(figsize=(7, 4.5))
    for name, points in systems.items():
        points.sort()
        axes.plot([size for size, _ in points], [algbw for _, algbw in points], marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("all-reduce size (bytes)")
    axes.set_ylabel("algbw (GB/s)")
    axes.set_title(f"float32 all-reduce, {figures['workers']} workers")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
