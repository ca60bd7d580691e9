"""Plots of the benchmarks' results, written beside their JSON (matplotlib: the `bench` extra,
`pip install ".[bench]"`; requirements-dev.txt has it; the node never imports this).

    python bench/plots.py long-run bench/results/long_run_h200_2026-12-01   # frame_times.png from its .npy
    python bench/plots.py latency out/latency/latency.json                 # latency.png beside it

long_run_gpu.py and node_latency.py call these themselves at the end of a run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

import matplotlib

matplotlib.use("Agg")   # files only: no display on a GPU host or in CI
import matplotlib.pyplot as plt  # noqa: E402

ROLLING = 101   # frames in the rolling median of the frame-time plot


def _save(figure, path: Path) -> Path:
    """The PNG under a temporary name in the target directory, then renamed."""
    path = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(temporary, format="png", dpi=110)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    finally:
        plt.close(figure)
    return path


def frame_times(frame_ms: np.ndarray, window: np.ndarray, path: Path, title: str = "") -> Path:
    """Frame time against frame index (every frame a dot, a rolling median over it), the frames
    that started a window marked; log scale, since a switch costs ~10x a frame."""
    frame_ms, window = np.asarray(frame_ms, dtype=np.float64), np.asarray(window)
    index = np.arange(len(frame_ms))
    switch = np.zeros(len(frame_ms), bool)
    switch[1:] = window[1:] != window[:-1]
    figure, axes = plt.subplots(figsize=(11, 4.5))
    axes.plot(index[~switch], frame_ms[~switch], ".", markersize=1, color="tab:blue", alpha=0.5, label="frame")
    if len(frame_ms) >= ROLLING:
        windows = np.lib.stride_tricks.sliding_window_view(np.where(switch, np.nan, frame_ms), ROLLING)
        axes.plot(index[ROLLING // 2:len(frame_ms) - ROLLING // 2], np.nanmedian(windows, axis=1),
                  color="black", linewidth=1.2, label=f"rolling median ({ROLLING} frames)")
    if switch.any():
        axes.plot(index[switch], frame_ms[switch], "v", color="tab:red", markersize=4,
                  label=f"window switch ({int(switch.sum())})")
    axes.set_yscale("log")
    axes.set_xlabel("frame")
    axes.set_ylabel("frame time (ms)")
    axes.set_title(textwrap.fill(title or f"frame time over {len(frame_ms):,} frames", 110), fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    return _save(figure, path)


def latency_histogram(latencies_ms: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """One histogram of end-to-end latency per input rate (label -> latencies in ms)."""
    figure, axes = plt.subplots(figsize=(9, 4.5))
    values = [np.asarray(v, dtype=np.float64) for v in latencies_ms.values() if len(v)]
    if values:
        every = np.concatenate(values)
        bins = np.linspace(every.min(), every.max(), 40) if every.max() > every.min() else 10
        for label, v in latencies_ms.items():
            if len(v):
                axes.hist(v, bins=bins, alpha=0.55, label=f"{label} (p50 {np.median(v):.1f} ms)")
        axes.legend()
    axes.set_xlabel("end-to-end latency, publish to ~/pose (ms)")
    axes.set_ylabel("frames")
    axes.set_title(textwrap.fill(title or "node latency", 90), fontsize=9)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    return _save(figure, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    long_run = sub.add_parser("long-run", help="frame_times.png from a long_run_gpu.py folder")
    long_run.add_argument("folder", type=Path)
    latency = sub.add_parser("latency", help="latency.png from a node_latency.py JSON")
    latency.add_argument("json", type=Path)
    args = parser.parse_args(argv)
    if args.kind == "long-run":
        summary = json.loads((args.folder / "summary.json").read_text())
        out = frame_times(np.load(args.folder / "frame_ms.npy"), np.load(args.folder / "window.npy"),
                          args.folder / "frame_times.png", long_run_title(summary))
    else:
        result = json.loads(args.json.read_text())
        out = latency_histogram(result["latencies_ms"], args.json.with_suffix(".png"), result.get("title", ""))
    print(out)
    return 0


def long_run_title(summary: dict) -> str:
    return (f"{summary.get('description', '')} on {summary.get('device', '')}: "
            f"window {summary.get('window_frames', '?')} frames, overlap {summary.get('overlap', '?')}")


if __name__ == "__main__":
    sys.exit(main())
