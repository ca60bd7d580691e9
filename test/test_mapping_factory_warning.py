"""The start-up warning of a run without a checkpoint names the architecture that runs (the node
logs it, lingbot-ros-offline prints it): the released one with random weights is no map either."""
from lingbot_ros.mapping import factory
from lingbot_ros.mapping.settings import MapperSettings
from lingbot_ros.tools import offline


def test_the_warning_names_the_released_architecture(monkeypatch, tmp_path):
    # The released architecture is too large to build here: what build passes on is what is checked.
    monkeypatch.setattr(factory, "load_model", lambda settings, device: (None, "stub"))
    monkeypatch.setattr(factory, "new_session", lambda model, settings: None)
    monkeypatch.setattr(factory, "Preprocessor", lambda **kwargs: None)
    bundle = factory.build(MapperSettings(model_config="lingbot-map", device="cpu"))
    assert bundle.random_weights
    assert "'lingbot-map' architecture with RANDOM weights" in bundle.untrained_warning()
    assert "tiny" not in bundle.untrained_warning()
    (tmp_path / "weights.pt").write_bytes(b"")   # load_model is stubbed: only its existence is checked
    with_checkpoint = factory.build(MapperSettings(model_config="lingbot-map", checkpoint=str(tmp_path / "weights.pt"),
                                                   device="cpu"))
    assert with_checkpoint.untrained_warning() == ""


def test_the_offline_tool_prints_the_architecture_it_runs(tmp_path, capsys):
    code = offline.main(["--model-config", "tiny", "--random-weights", "--input", "synthetic:112x84:2",
                         "--output", str(tmp_path), "--device", "cpu", "--num-scale-frames", "2",
                         "--image-width", "112", "--no-warmup", "--map-database", ""])
    assert code == 0
    assert "'tiny' architecture with RANDOM weights" in capsys.readouterr().err
