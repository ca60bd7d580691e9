"""lingbot-ros-prebuild: build the one-off GPU kernels ahead of the node's first start.

On a machine that never ran the model on CUDA, the first warm-up JIT-compiles FlashInfer's
attention module (over a minute on an H200) and torch.compile's fused blocks. Both land in disk
caches (~/.cache/flashinfer, ~/.cache/lingbot_ros/torchinductor) that later starts reuse. Run this
once where the node will run (set-up script, Dockerfile, a robot's image build), with the
settings the node will use: it builds the model (random weights: the kernels do not depend on
them), runs the node's warm-up at ``--warmup-image-size`` (auto: 640x480, with no images to read
the size from) and prints each phase's time.

    lingbot-ros-prebuild --warmup-image-size 640x480          # CUDA, the released architecture
"""
from __future__ import annotations

import dataclasses
import sys
import time

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.settings import MapperSettings, SettingsError
from lingbot_ros.mapping.warmup_size import warmup_size
from lingbot_ros.process import interrupts
from lingbot_ros.tools.command_line import Parser
from lingbot_ros.tools.settings_flags import add_settings_arguments, settings_from_args


def main(argv=None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-prebuild")


def _main(argv) -> int:
    parser = Parser(prog="lingbot-ros-prebuild", description=__doc__.split("\n\n")[0])
    add_settings_arguments(parser, exclude=("checkpoint",))
    parser.set_defaults(model_config="lingbot-map", device="cuda")
    args = parser.parse_args(argv)
    try:
        settings = dataclasses.replace(settings_from_args(args, MapperSettings), warmup=True)
    except SettingsError as error:
        print(f"lingbot-ros-prebuild: error: {error}", file=sys.stderr)
        return 2
    import torch

    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        print("lingbot-ros-prebuild: CUDA is not available here; there is nothing to build for the CPU",
              file=sys.stderr)
        return 2
    total = time.perf_counter()

    def phase(name: str, work):
        print(f"[prebuild] {name} ...", flush=True)
        start = time.perf_counter()
        result = work()
        print(f"[prebuild] {name}: {time.perf_counter() - start:.1f} s", flush=True)
        return result

    try:
        bundle = phase("model and session", lambda: factory.build(settings))
        mapper = Mapper(settings, bundle)
        size = warmup_size(settings)
        phase(f"warm-up on {size.describe()} (FlashInfer JIT, torch.compile, graph capture)",
              lambda: mapper.warm_up(size))
    except Exception as error:   # any build failure: say which, with the hint the node gives
        print(f"lingbot-ros-prebuild: error: {type(error).__name__}: {error}{factory.failure_hint(error, settings)}",
              file=sys.stderr)
        return 1
    captures = bundle.session.stats().graph_captures
    print(f"[prebuild] done in {time.perf_counter() - total:.1f} s ({bundle.description}, "
          f"{captures} graph captures); the node's warm-up now reuses the disk caches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
