"""RoPE (spec 8): rotate-half 2D pairs, interleaved 3D pairs, any time index, no 1024 limit."""
import logging

import pytest
import torch

from lingbot_ros.model import ModelConfig, build_model
from lingbot_ros.model.rope import Rope2D, Rope3D
from lingbot_ros.stream import StreamingSession, StreamSettings

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def table_3d(max_frame_num, fhw=(20, 22, 22), theta=10000.0):
    """Upstream-style precomputed complex128 tables over positions 0..max_frame_num-1, per axis."""
    pos = torch.arange(max_frame_num, dtype=torch.float64)
    tables = []
    for d in fhw:
        freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        tables.append(torch.polar(torch.ones(max_frame_num, d // 2, dtype=torch.float64), torch.outer(pos, freqs)))
    return tables


def expected_3d(f, h, w, max_frame_num, num_special=6):
    t, a, b = table_3d(max_frame_num)
    rows = torch.cat([torch.arange(num_special), num_special + torch.arange(h).repeat_interleave(w)])
    cols = torch.cat([torch.arange(num_special), num_special + torch.arange(w).repeat(h)])
    z = torch.cat([t[f].expand(len(rows), -1), a[rows], b[cols]], dim=-1)        # [P, 32] complex
    return z.real.float().repeat_interleave(2, -1), z.imag.float().repeat_interleave(2, -1)


def test_3d_rope_equals_precomputed_table_below_max_frame_num():
    rope = Rope3D(64, (20, 22, 22), 10000.0, 6)
    times = torch.tensor([0, 1, 7, 500, 1023], dtype=torch.float64)
    rot = rope(times, 3, 5)
    for i, f in enumerate(times.long().tolist()):
        cos, sin = expected_3d(f, 3, 5, 1024)
        torch.testing.assert_close(rot.cos[i, :, 0], cos, rtol=0, atol=1e-7)
        torch.testing.assert_close(rot.sin[i, :, 0], sin, rtol=0, atol=1e-7)


def test_3d_rope_beyond_the_table_is_finite_and_a_rotation():
    rot = Rope3D(64, (20, 22, 22), 10000.0, 6)(torch.tensor([1024.0, 10**6]), 2, 2)
    assert torch.isfinite(rot.cos).all()
    torch.testing.assert_close(rot.cos ** 2 + rot.sin ** 2, torch.ones_like(rot.cos))


def test_3d_rope_pairs_are_interleaved():
    rot = Rope3D(64, (20, 22, 22), 10000.0, 6)(torch.tensor([3.0]), 1, 1)
    x = torch.randn(1, 7, 1, 64)
    out = rot(x)
    c, s = rot.cos[0, :, 0, 0::2], rot.sin[0, :, 0, 0::2]
    torch.testing.assert_close(out[0, :, 0, 0::2], x[0, :, 0, 0::2] * c - x[0, :, 0, 1::2] * s)
    torch.testing.assert_close(out[0, :, 0, 1::2], x[0, :, 0, 0::2] * s + x[0, :, 0, 1::2] * c)


def test_2d_rope_follows_the_spec_formula():
    h, w, D = 2, 3, 64
    rot = Rope2D(D, 100.0, 6)(h, w, "cpu")
    x = torch.randn(1, 6 + h * w, 1, D, dtype=torch.float32)
    out = rot(x)[0, :, 0]
    omega = 100.0 ** (-torch.arange(16, dtype=torch.float64) / 16)
    for t in range(6 + h * w):
        py, px = (0, 0) if t < 6 else ((t - 6) // w + 1, (t - 6) % w + 1)
        for half, pos in ((slice(0, 32), py), (slice(32, 64), px)):
            u = x[0, t, 0, half].double()
            th = pos * omega
            ref = torch.cat([u[:16] * th.cos() - u[16:] * th.sin(), u[16:] * th.cos() + u[:16] * th.sin()])
            torch.testing.assert_close(out[t, half].double(), ref, rtol=1e-5, atol=1e-6)


def stream(max_frame_num, frames):
    cfg = ModelConfig.preset("tiny").replace(max_frame_num=max_frame_num)
    session = StreamingSession(build_model(cfg), StreamSettings(num_scale_frames=2, scale_frames=2,
                                                                sliding_window=3))
    return [r for f in frames for r in session.step(f)]


def test_streaming_past_max_frame_num_works(caplog):
    frames = torch.rand(12, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="lingbot_ros.stream.session"):
        short = stream(8, frames)
    assert [r.time_index for r in short] == list(range(12))
    assert sum("max_frame_num=8" in r.message for r in caplog.records) == 1
    assert all(torch.isfinite(r.depth).all() and torch.isfinite(r.pose_enc).all() for r in short)
    # The table size changes nothing: rotations are computed on the fly for every index.
    full = stream(1024, frames)
    for a, b in zip(short, full):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=0, atol=0)
