#!/usr/bin/python3
"""Plots one `xagg bench hetero` result file: a bar chart of the median
critical-path communication and iteration time per system, and the CDF of the
critical-path communication time per system; both mark the link bound (the
least critical path the links allow any system) where it is above zero.
Usage: scripts/plot_hetero.py RESULT.json OUTDIR  (Debian: python3-matplotlib)"""
import json
import pathlib
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(result_file, out_dir):
    result = json.loads(pathlib.Path(result_file).read_text())
    out = pathlib.Path(out_dir)
    systems = result["systems"]
    names = [s["system"] for s in systems]
    scenario = result["scenario"]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [s["median_critical_ms"] for s in systems], 0.4, label="critical-path comm.")
    ax.bar([i + 0.2 for i in x], [s["median_iteration_ms"] for s in systems], 0.4, label="iteration")
    bound = statistics.median([s["median_link_bound_ms"] for s in systems])  # as the table prints them
    if bound > 0:
        ax.axhline(bound, color="black", linestyle="--", linewidth=1, label=f"link bound ({bound:.1f})")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("median (ms)")
    ax.set_title(f"{scenario}: {result['workers']} workers, {result['model']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{scenario}-bars.png", dpi=120)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for s in systems:
        values = sorted(s["critical_ms"])
        ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=s["system"])
    if bound > 0:
        ax.axvline(bound, color="black", linestyle="--", linewidth=1, label="link bound")
    ax.set_xlabel("critical-path communication time (ms)")
    ax.set_ylabel("CDF")
    ax.set_title(scenario)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{scenario}-cdf.png", dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
