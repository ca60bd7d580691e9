"""lingbot-ros-prebuild, run as a user would: the warm-up with the node's settings, or a clear refusal."""
import pytest
import torch

from lingbot_ros.tools import prebuild


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_there_is_nothing_to_build(capsys):
    assert prebuild.main([]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_it_runs_the_nodes_warm_up_and_reports_each_phase(capsys):
    assert prebuild.main(["--device", "cpu", "--model-config", "tiny", "--image-width", "112",
                          "--warmup-image-size", "160x120"]) == 0
    out = capsys.readouterr().out
    assert "[prebuild] model and session:" in out
    assert "[prebuild] warm-up on 160x120 images (warmup_image_size; model input 112x84)" in out
    assert "[prebuild] done in" in out


def test_bad_settings_are_named(capsys):
    assert prebuild.main(["--device", "cpu", "--warmup-image-size", "640*480"]) == 2
    assert "--warmup-image-size must be auto or WIDTHxHEIGHT" in capsys.readouterr().err
