"""Warm-up of the released architecture on a GPU: where the seconds before the first real-time
frame go, on a cold machine or a warm one.

Phases, each timed: importing torch and the package, building the model (random weights), the
phase-1 batch (on a cold machine: FlashInfer's JIT build of its attention kernels), the first
phase-2 frame (torch.compile of the fused blocks, then the CUDA-graph capture), a second
phase-2 frame, and the same two phases of a second session in the same process (what reset
costs). FlashInfer keeps its builds in ~/.cache/flashinfer and the node keeps Inductor's in
~/.cache/lingbot_ros/torchinductor; run this twice on one machine to see cold and cached.

    python bench/warmup_gpu.py
"""
from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.stream_gpu import synthetic_frames  # noqa: E402
from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402


def timed_module_builds(timings: list[float]) -> None:
    """Record the time of each FlashInfer prefill-module lookup (a JIT build when not cached)."""
    import flashinfer.prefill as prefill
    inner = prefill.get_batch_prefill_module

    def timed(*args):
        t = time.perf_counter()
        try:
            return inner(*args)
        finally:
            timings.append(time.perf_counter() - t)
    prefill.get_batch_prefill_module = timed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("this benchmark times the CUDA warm-up (FlashInfer JIT, torch.compile, graph capture): it needs a CUDA device")
    rows = [("import torch + package", time.perf_counter() - START)]
    module_builds: list[float] = []
    timed_module_builds(module_builds)

    def phase(name, fn):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        rows.append((name, time.perf_counter() - t))
        print(f"{name}: {rows[-1][1]:.1f} s", file=sys.stderr, flush=True)

    settings = MapperSettings(model_config=args.preset, checkpoint="", device="cuda")
    holder = {}
    # As the node loads it: Inductor's cache directory set, matmul weights stored in bf16.
    phase("build model", lambda: holder.update(model=factory.load_model(settings, "cuda")[0]))
    model = holder["model"]
    images = synthetic_frames(settings.num_scale_frames + 2, args.height, args.width, "cuda")
    for run in ("first session", "second session"):
        session = factory.new_session(model, settings)
        for img in images[:settings.num_scale_frames - 1]:
            session.step(img)
        phase(f"{run}: phase-1 batch", lambda: session.step(images[settings.num_scale_frames - 1]))
        for k, img in enumerate(images[settings.num_scale_frames:]):
            phase(f"{run}: phase-2 frame {k + 1}", lambda: session.step(img))
    print("| phase | seconds |")
    print("| --- | --- |")
    for name, s in rows:
        print(f"| {name} | {s:.1f} |")
    print(f"\nFlashInfer prefill-module lookups: {', '.join(f'{s:.1f}' for s in module_builds)} s; "
          f"the first session's phases: {sum(s for n, s in rows if n.startswith('first session')):.1f} s\n")
    from torch._dynamo.utils import compile_times
    print(compile_times(repr="str", aggregate=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
