"""Windowed mode (spec 13.1): window list, alignment, warp, stitching, the offline run."""
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from lingbot_ros.mapping.windows.similarity import (AlignmentError, Similarity, align_window, depth_ratio_scale,
                                            overlap_agreement, rotations_to_quaternions, warp_frame, warp_frames,
                                            warp_pose_enc)
from lingbot_ros.mapping.placement.geometry import rotation_to_quaternion
from lingbot_ros.mapping.windows.offline import KEYFRAME, NON_KEYFRAME, PHASE1, WindowedRun, frame_type, stitch_plan
from lingbot_ros.mapping.windows.rule import WindowError, WindowLayout, WindowRule
from lingbot_ros.model import ModelConfig, build_model
from lingbot_ros.model.geometry import depth_to_world_points, pose_to_extrinsic, pose_to_intrinsic
from lingbot_ros.stream import FrameResult, StreamingSession, StreamSettings


# ---- window list ---------------------------------------------------------------------------------

def windows(S, n, Wk, K=1, **overlap):
    return WindowRule(Wk, n, K, **overlap).windows(S)


def test_spec_examples():
    # S = 40, n = 3, Wk = 12: K = 1 -> ov = 3, L = 12; K = 2 -> L = 3 + 9 * 2 = 21.
    assert windows(40, 3, 12, 1) == [(0, 12), (9, 21), (18, 30), (27, 39), (36, 40)]
    assert windows(40, 3, 12, 2) == [(0, 21), (18, 39), (36, 40)]
    assert WindowRule(12, 3, 2).layout(40) == WindowLayout(scale_frames=3, overlap=3, window_frames=21,
                                                           frames_per_window=21, step=18)


def test_tiny_windowed_list():
    # The shared fixture: S = 32, n = 3, Wk = 10 keyframes, overlap_size 4 -> L = 10, step 6.
    rule = WindowRule(10, 3, 1, overlap_size=4)
    assert rule.windows(32) == [(0, 10), (6, 16), (12, 22), (18, 28), (24, 32)]


def test_overlap_precedence_and_clamps():
    # overlap_keyframes wins over overlap_size and counts keyframes at interval K, at least ws.
    assert WindowRule(10, 3, 3, overlap_size=1, overlap_keyframes=2).layout(100).overlap == 6
    assert WindowRule(10, 3, 3, overlap_keyframes=0).layout(100).overlap == 3
    # overlap_size is frames and is not raised to the phase-1 count.
    assert WindowRule(10, 3, 3, overlap_size=1).layout(100).overlap == 1
    assert WindowRule(10, 3, 3).layout(100).overlap == 3                  # neither: ws
    # ov <= S - 1, and S = 1 -> 0; ws = min(n, S).
    assert WindowRule(10, 3, 1, overlap_size=50).layout(20).overlap == 19
    assert WindowRule(10, 3, 1, overlap_size=50).layout(1).overlap == 0
    assert WindowRule(10, 8, 1, overlap_keyframes=1).layout(5).overlap == 4   # max(ws=5, 1) clamped to 4
    assert WindowRule(10, 8, 1).layout(5).scale_frames == 5
    # keyframe_interval 0 counts as 1.
    assert WindowRule(12, 3, 0).windows(40) == windows(40, 3, 12, 1)


def test_degenerate_lists():
    # ov = 0: the windows tile.
    assert windows(25, 2, 10, overlap_size=0) == [(0, 10), (10, 20), (20, 25)]
    # ov = Lw: step 1, every window kept; only the last contributes frames.
    assert windows(7, 2, 4, overlap_size=4) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert stitch_plan([(0, 4), (1, 5), (2, 6), (3, 7)], 4) == [(3, 3, 0), (4, 3, 1), (5, 3, 2), (6, 3, 3)]
    # ov > Lw: only (S - Lw, S) is run.
    assert windows(10, 2, 4, overlap_size=6) == [(6, 10)]
    # S <= Lw: one window; S = 1; S < n.
    assert windows(12, 3, 12) == [(0, 12)]
    assert windows(1, 3, 12) == [(0, 1)]
    assert windows(5, 8, 2) == [(0, 5)]


def test_bad_rule_settings_are_named():
    with pytest.raises(WindowError, match="window_size"):
        WindowRule(0, 3)
    with pytest.raises(WindowError, match="overlap_size"):
        WindowRule(10, 3, overlap_size=-1)
    with pytest.raises(WindowError, match="num_frames"):
        WindowRule(10, 3).windows(0)


def live_windows(rule, S):
    """A live caller's list: start window k when frame switch_frame(k) arrives; the stream's end
    closes the last one."""
    out, k = [], 0
    for f in range(S):
        if f == rule.switch_frame(k + 1):
            out.append((rule.window_start(k), f))
            k += 1
    return out + [(rule.window_start(k), S)]


@pytest.mark.parametrize("n, Wk, K", [(1, 1, 1), (3, 10, 1), (3, 12, 2), (2, 5, 3), (8, 4, 1), (4, 6, 0)])
def test_live_rule_reproduces_the_list(n, Wk, K):
    for ov, S in itertools.product([None, 0, 1, 2, 3, 5, 8], range(1, 61)):
        rule = WindowRule(Wk, n, K, overlap_size=ov)
        if rule.overlap >= rule.window_frames:
            with pytest.raises(WindowError, match="overlap"):
                rule.check_live()
            continue
        rule.check_live()
        listed = rule.windows(S)
        assert live_windows(rule, S) == listed, (ov, S)
        # Re-run frames at each switch: exactly the overlap.
        for k in range(1, len(listed)):
            assert rule.switch_frame(k) - rule.window_start(k) == rule.overlap
        # Stitching: every frame once, frame f from window min(f // step, n_win - 1).
        plan = stitch_plan(listed, rule.layout(S).overlap)
        assert [f for f, _, _ in plan] == list(range(S))
        assert [w for _, w, _ in plan] == [rule.final_window(f, len(listed)) for f in range(S)]
        assert all(listed[w][0] + j == f for f, w, j in plan)
        if len(listed) > 1:                         # the last window holds >= ov + 1 frames
            assert listed[-1][1] - listed[-1][0] >= rule.overlap + 1


def test_switch_frame_needs_a_later_window():
    with pytest.raises(WindowError, match="k >= 1"):
        WindowRule(10, 3).switch_frame(0)


def test_frame_type():
    assert [frame_type(j, 3, kf) for j, kf in enumerate([True] * 4 + [False, True])] == \
        [PHASE1] * 3 + [KEYFRAME, NON_KEYFRAME, KEYFRAME]


# ---- rotations, similarity, warp -----------------------------------------------------------------

def naive_rotation(q):
    """Unit-quaternion rotation matrix (x, y, z, w), float64 numpy, normalising first."""
    x, y, z, w = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def random_quaternions(rng, count):
    q = rng.normal(size=(count, 4))
    # Near-180-degree rotations (w ~ 0, each axis dominant in turn) exercise every branch.
    q[:4] = np.eye(4)[[0, 1, 2, 3]] + 1e-3 * rng.normal(size=(4, 4))
    return q


def test_rotations_to_quaternions_matches_the_numpy_reference():
    rng = np.random.default_rng(0)
    q = random_quaternions(rng, 64)
    R = np.stack([naive_rotation(x) for x in q])
    ours = rotations_to_quaternions(torch.tensor(R, dtype=torch.float32)).double().numpy()
    expected = np.stack([rotation_to_quaternion(r) for r in R])
    np.testing.assert_allclose(ours, expected, atol=2e-6)
    assert (ours[:, 3] >= 0).all()
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-6)


def test_similarity_matrices():
    sim = Similarity(torch.tensor(2.0), torch.tensor([[0., -1, 0], [1, 0, 0], [0, 0, 1]]),
                     torch.tensor([1., 2, 3]))
    X = torch.tensor([[1., 0, 0], [0, 1, 2]])
    # s R X + t by hand: R maps x -> y, y -> -x.
    torch.testing.assert_close(sim.apply(X), torch.tensor([[1., 4, 3], [-1, 2, 7]]))
    homogeneous = torch.cat([X, torch.ones(2, 1)], dim=1) @ sim.matrix().T
    torch.testing.assert_close(homogeneous[:, :3], sim.apply(X))
    rigid = sim.rigid_matrix()
    torch.testing.assert_close(rigid[:3, :3], sim.rotation)
    torch.testing.assert_close(rigid[:3, 3], sim.translation)
    torch.testing.assert_close(rigid[3], torch.tensor([0., 0, 0, 1]))
    ident = Similarity.identity()
    assert ident.scale.dtype == ident.rotation.dtype == ident.translation.dtype == torch.float32
    torch.testing.assert_close(ident.matrix(), torch.eye(4))


def test_warp_pose_by_hand():
    # 90 degrees about z, s = 2, t = (1, 2, 3); camera at (1, 0, 0) with an unnormalised identity
    # quaternion -> centre (1, 4, 3), quaternion (0, 0, sin 45, cos 45), FoV kept.
    sim = Similarity(torch.tensor(2.0), torch.tensor([[0., -1, 0], [1, 0, 0], [0, 0, 1]]),
                     torch.tensor([1., 2, 3]))
    pose = torch.tensor([1., 0, 0, 0, 0, 0, 3, 0.7, 0.9])
    h = math.sqrt(0.5)
    torch.testing.assert_close(warp_pose_enc(pose, sim), torch.tensor([1., 4, 3, 0, 0, h, h, 0.7, 0.9]))
    # The identity warp still normalises and makes w >= 0 (the multi-window quirk).
    flipped = torch.tensor([0., 0, 0, 0, 0, 0, -2, 0.5, 0.5])
    torch.testing.assert_close(warp_pose_enc(flipped, Similarity.identity())[3:7], torch.tensor([0., 0, 0, 1]))


def make_result(pose_enc, depth, is_keyframe=True, conf=None):
    H, W = depth.shape
    extrinsic = pose_to_extrinsic(pose_enc)
    intrinsic = pose_to_intrinsic(pose_enc, W, H)
    points = depth_to_world_points(depth[None], extrinsic[None], intrinsic[None])[0]
    return FrameResult(index=0, is_keyframe=is_keyframe, time_index=0, pose_enc=pose_enc,
                       pose_enc_list=torch.stack([pose_enc, pose_enc]), extrinsic=extrinsic,
                       intrinsic=intrinsic, depth=depth, depth_conf=conf if conf is not None else depth + 1,
                       world_points=points, image=torch.zeros(3, H, W), image_size=(W, H))


def test_warp_frame_moves_points_scales_depth_keeps_confidence():
    gen = torch.Generator().manual_seed(0)
    pose = torch.cat([torch.randn(3, generator=gen), torch.randn(4, generator=gen) * 2, torch.tensor([0.8, 1.0])])
    r = make_result(pose, torch.rand(5, 7, generator=gen) + 0.5)
    q = torch.tensor([0.3, -0.2, 0.5, 0.8])
    sim = Similarity(torch.tensor(1.7), torch.tensor(naive_rotation(q), dtype=torch.float32),
                     torch.tensor([0.5, -1.0, 2.0]))
    w = warp_frame(r, sim)
    torch.testing.assert_close(w.world_points, sim.apply(r.world_points), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.depth, 1.7 * r.depth)
    assert torch.equal(w.depth_conf, r.depth_conf) and torch.equal(w.intrinsic, r.intrinsic)
    R = sim.rotation @ r.extrinsic[:, :3]
    torch.testing.assert_close(w.extrinsic[:, :3], R, atol=1e-6, rtol=0)
    torch.testing.assert_close(w.extrinsic[:, 3], sim.apply(r.extrinsic[:, 3]))
    torch.testing.assert_close(w.pose_enc_list[1], w.pose_enc)
    assert torch.equal(w.pose_enc[7:], r.pose_enc[7:]) and w.pose_enc[6] >= 0
    assert (w.index, w.is_keyframe, w.time_index) == (r.index, r.is_keyframe, r.time_index)


def test_frames_warped_together_equal_each_warped_alone():
    """A switch warps its overlap at once (one copy each way): the same values as one by one,
    whatever the batch."""
    gen = torch.Generator().manual_seed(1)
    results = []
    for _ in range(5):
        pose = torch.cat([torch.randn(3, generator=gen), torch.randn(4, generator=gen), torch.tensor([0.8, 1.0])])
        results.append(make_result(pose, torch.rand(5, 7, generator=gen) + 0.5))
    q = torch.tensor([-0.4, 0.1, 0.3, 0.85])
    sim = Similarity(torch.tensor(0.6), torch.tensor(naive_rotation(q), dtype=torch.float32),
                     torch.tensor([1.5, 0.0, -2.0]))
    together, alone = warp_frames(results, sim), [warp_frame(r, sim) for r in results]
    assert warp_frames([], sim) == []
    for a, b in zip(together, alone, strict=True):
        for key in ("pose_enc", "pose_enc_list", "extrinsic", "depth", "world_points"):
            assert torch.equal(getattr(a, key), getattr(b, key)), key


# ---- alignment -----------------------------------------------------------------------------------

@dataclass
class Frame:
    pose_enc: torch.Tensor
    depth: torch.Tensor
    is_keyframe: bool = True


def seen_through(frame, s, R, t, is_keyframe=True):
    """The frame as a window related by X -> s R X + t sees it (float64 numpy reference)."""
    pose = frame.pose_enc.double().numpy()
    centre = s * R @ pose[:3] + t
    quat = rotation_to_quaternion(R @ naive_rotation(pose[3:7]))
    pose_enc = np.concatenate([centre, quat, pose[7:]])
    return Frame(torch.tensor(pose_enc, dtype=torch.float32), frame.depth * s, is_keyframe)


def random_frames(rng, count, shape=(4, 6)):
    return [Frame(torch.tensor(np.concatenate([rng.normal(size=3) * 3, rng.normal(size=4) * 1.5, [0.8, 1.0]]),
                               dtype=torch.float32),
                  torch.tensor(rng.uniform(0.5, 5, size=shape), dtype=torch.float32)) for _ in range(count)]


def random_similarity(rng):
    return rng.uniform(0.2, 5), naive_rotation(rng.normal(size=4)), rng.normal(size=3) * 4


def assert_similarity(sim, s, R, t, atol=2e-5):
    np.testing.assert_allclose(float(sim.scale), s, rtol=1e-5)
    np.testing.assert_allclose(sim.rotation.numpy(), R, atol=atol)
    np.testing.assert_allclose(sim.translation.numpy(), t, atol=atol * max(1, np.abs(t).max()) * 10)
    assert sim.scale.dtype == sim.rotation.dtype == sim.translation.dtype == torch.float32


@pytest.mark.parametrize("estimator", ["anchor", "all_frames"])
def test_alignment_recovers_a_known_similarity(estimator):
    rng = np.random.default_rng(1)
    for _ in range(5):
        s, R, t = random_similarity(rng)
        cur = random_frames(rng, 6)                                   # window k, raw
        # window k-1 (already warped): 3 frames of its own, then the 4 overlap frames.
        prev = random_frames(rng, 3) + [seen_through(f, s, R, t) for f in cur[:4]]
        assert_similarity(align_window(prev, cur, 4, estimator), s, R, t)
        # A live caller passing only the overlap frames of both gets the same similarity.
        assert_similarity(align_window(prev[-4:], cur[:4], 4, estimator), s, R, t)


def test_anchor_is_the_latest_keyframe_pair_and_scale_pools_only_pairs():
    rng = np.random.default_rng(2)
    cur = random_frames(rng, 4, shape=(2, 2))
    sims = [random_similarity(rng) for _ in range(4)]
    sims = [(scale,) + sims[j][1:] for j, scale in enumerate([1.5, 10.0, 3.0, 10.0])]
    prev_flags, cur_flags = [True, False, True, True], [True, True, True, False]   # pairs: J = {0, 2}
    prev = [seen_through(f, *sims[j], is_keyframe=prev_flags[j]) for j, f in enumerate(cur)]
    for f, flag in zip(cur, cur_flags):
        f.is_keyframe = flag
    sim = align_window(prev, cur, 4)
    # Pooled ratios of frames 0 and 2: four 1.5s and four 3s -> lower median 1.5 (the mean of the
    # middle two would be 2.25; with frames 1 and 3 pooled too it would be 3).
    assert float(sim.scale) == pytest.approx(1.5, rel=1e-6)
    _, R2, t2 = sims[2]
    np.testing.assert_allclose(sim.rotation.numpy(), R2, atol=2e-5)
    # t = c_a - s R c_b of the anchor frame 2, with the pooled s.
    c_a, c_b = prev[2].pose_enc[:3].double().numpy(), cur[2].pose_enc[:3].double().numpy()
    np.testing.assert_allclose(sim.translation.numpy(), c_a - 1.5 * R2 @ c_b, atol=1e-4)


def test_no_keyframe_pair_falls_back_to_frame_zero():
    rng = np.random.default_rng(3)
    cur = random_frames(rng, 2, shape=(2, 2))
    sims = [(2.0,) + random_similarity(rng)[1:], (7.0,) + random_similarity(rng)[1:]]
    prev = [seen_through(cur[0], *sims[0], is_keyframe=False), seen_through(cur[1], *sims[1], is_keyframe=True)]
    cur[0].is_keyframe, cur[1].is_keyframe = True, False
    assert_similarity(align_window(prev, cur, 2), *sims[0])


def test_lower_median_and_validity_rule():
    r = depth_ratio_scale
    assert float(r([torch.tensor([4., 1, 3, 2])], [torch.ones(4)])) == 2.0       # even count: rank 1
    assert float(r([torch.tensor([3., 1, 2])], [torch.ones(3)])) == 2.0
    tiny = 2.0 ** -23
    p = torch.tensor([5., 7, -12, 6 * 2 * tiny, float("nan"), float("inf"), 1, 1, 1, 1, 1000 * tiny])
    q = torch.tensor([1., 1, -2, 2 * tiny, 1, 1, 0, 1e-8, float("nan"), float("inf"), tiny])
    # Valid: 5, 7, 6, 6 (negative and just-above-epsilon depths count) -> lower median 6.
    assert float(r([p[:6], p[6:]], [q[:6], q[6:]])) == pytest.approx(6.0)
    assert float(r([torch.ones(2)], [torch.zeros(2)])) == 1.0                      # none valid -> 1
    assert float(r([torch.full((3,), 1e5)], [torch.ones(3)])) == pytest.approx(1e3)   # clamped
    assert float(r([torch.full((3,), 1e-6)], [torch.ones(3)])) == pytest.approx(1e-3)


def rot_z(deg):
    a = math.radians(deg)
    return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])


def test_all_frames_averages_rotation_and_fits_translation():
    # Two pairs whose rotations are off by +10 and -10 degrees about z and whose centres are off
    # by +d and -d: the chordal mean and the least-squares t cancel both; the anchor takes pair 1.
    rng = np.random.default_rng(5)
    cur = random_frames(rng, 2, shape=(2, 2))
    s, R, t = random_similarity(rng)
    d = np.array([0.3, -0.2, 0.1])
    prev = [seen_through(f, s, R, t) for f in cur]
    for j, sign in enumerate((1, -1)):
        prev[j].pose_enc[3:7] = seen_through(cur[j], s, rot_z(10 * sign) @ R, t).pose_enc[3:7]
        prev[j].pose_enc[:3] += torch.tensor(sign * d, dtype=torch.float32)
    assert_similarity(align_window(prev, cur, 2, "all_frames"), s, R, t, atol=5e-5)
    anchor = align_window(prev, cur, 2, "anchor")
    np.testing.assert_allclose(anchor.rotation.numpy(), rot_z(-10) @ R, atol=2e-5)


def test_overlap_agreement_by_hand():
    line = [Frame(torch.tensor([float(x), 0, 0, 0, 0, 0, 1, 1, 1]), torch.ones(1, 1)) for x in range(4)]
    shifted = [Frame(f.pose_enc + torch.tensor([0., 1, 0, 0, 0, 0, 0, 0, 0]), f.depth) for f in line]
    # prev: 4 frames, overlap 3 -> its frames 1..3 pair with cur's 0..2 (x = 1, 2, 3 vs x = 0, 1, 2, y = 1).
    distance, motion = overlap_agreement(line, shifted, 3, Similarity.identity())
    assert distance == pytest.approx(math.sqrt(2)) and motion == pytest.approx(2.0)
    back = Similarity(torch.tensor(1.0), torch.eye(3), torch.tensor([1., -1, 0]))
    assert overlap_agreement(line, shifted, 3, back) == pytest.approx((0.0, 2.0), abs=1e-6)
    assert overlap_agreement(line, shifted, 0, back) == (0.0, 0.0)


def test_no_overlap_is_the_identity_and_bad_calls_are_named():
    rng = np.random.default_rng(4)
    frames = random_frames(rng, 2)
    sim = align_window(frames, frames[::-1], 0)
    torch.testing.assert_close(sim.matrix(), torch.eye(4))
    with pytest.raises(AlignmentError, match="estimator"):
        align_window(frames, frames, 1, estimator="mean")
    with pytest.raises(AlignmentError, match="frames of both"):
        align_window([], frames, 1)


# ---- the offline run with a tiny model -----------------------------------------------------------

H, W = 28, 42


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig.preset("tiny"), seed=5)


@pytest.fixture(scope="module")
def images():
    return torch.rand(23, 3, H, W, generator=torch.Generator().manual_seed(2))


def settings(**kw):
    return StreamSettings(**{**dict(num_scale_frames=2, scale_frames=2, sliding_window=3,
                                    camera_num_iterations=2), **kw})


def stream(model, stream_settings, images):
    session = StreamingSession(model, stream_settings)
    return [r for f in images for r in session.step(f)] + session.close_scale_phase()


def assert_same(a, b, keys=("pose_enc", "depth", "depth_conf", "extrinsic", "world_points")):
    for key in keys:
        torch.testing.assert_close(getattr(a, key), getattr(b, key), rtol=0, atol=1e-6, msg=key)


@pytest.mark.usefixtures("torch_single_thread")
@pytest.mark.parametrize("K, Wk, overlap", [(1, 6, 3), (2, 4, 1), (1, 5, 0)])
def test_windowed_run_matches_separate_streams(model, images, K, Wk, overlap):
    """Reference: each listed window streamed by its own fresh session, chained by hand."""
    stream_settings = settings(keyframe_interval=K)
    rule = WindowRule.from_settings(stream_settings, Wk, overlap_size=overlap)
    S = len(images)
    run = WindowedRun(StreamingSession(model, stream_settings), rule, S)
    out = list(run.frames(images))
    listed = rule.windows(S)
    assert len(listed) >= 3 and run.windows == listed
    expected, prev = {}, None
    for k, (start, end) in enumerate(listed):
        raw = stream(model, stream_settings, images[start:end])
        sim = Similarity.identity() if k == 0 else align_window(prev, raw, overlap)
        prev = [warp_frame(r, sim) for r in raw]
        torch.testing.assert_close(run.similarities[k].matrix(), sim.matrix(), rtol=0, atol=1e-6)
        expected.update({(k, j): r for j, r in enumerate(prev)})
    # Stitched: frame f from window min(f // step, n_win - 1), every quaternion unit with w >= 0.
    assert [w.frame for w in out] == list(range(S))
    step = rule.layout(S).step
    for w in out:
        k = min(w.frame // step, len(listed) - 1)
        j = w.frame - listed[k][0]
        assert (w.window, w.result.index) == (k, j)
        assert w.frame_type == frame_type(j, 2, expected[k, j].is_keyframe)
        assert_same(w.result, expected[k, j])
        torch.testing.assert_close(w.result.pose_enc[3:7].norm(), torch.tensor(1.0))
        assert w.result.pose_enc[6] >= 0
    assert run.chunk_scales().shape == (len(listed),) and run.chunk_transforms().shape == (len(listed), 4, 4)
    if overlap == 0:                                      # tiling: nothing aligned
        torch.testing.assert_close(run.chunk_transforms(), torch.eye(4).expand(len(listed), 4, 4))


@pytest.mark.usefixtures("torch_single_thread")
def test_single_window_is_the_raw_stream(model, images):
    stream_settings = settings()
    run = WindowedRun(StreamingSession(model, stream_settings),
                      WindowRule.from_settings(stream_settings, 10, overlap_size=2), 8)
    assert not run.aligned
    out = list(run.frames(images[:8]))
    for w, r in zip(out, stream(model, stream_settings, images[:8]), strict=True):
        assert torch.equal(w.result.pose_enc, r.pose_enc)          # raw, unnormalised quaternions
    assert not torch.allclose(torch.stack([w.result.pose_enc[3:7].norm() for w in out]), torch.ones(8))


@pytest.mark.usefixtures("torch_single_thread")
def test_only_the_last_window_when_overlap_exceeds_it(model, images):
    stream_settings = settings()
    run = WindowedRun(StreamingSession(model, stream_settings),
                      WindowRule.from_settings(stream_settings, 4, overlap_size=6), 10)
    out = list(run.frames(images[:10]))
    assert run.windows == [(6, 10)] and [w.frame for w in out] == [6, 7, 8, 9]
    for w, r in zip(out, stream(model, stream_settings, images[6:10]), strict=True):
        assert_same(w.result, warp_frame(r, Similarity.identity()))


def test_run_rejects_mismatched_settings_and_short_inputs(model, images):
    stream_settings = settings()
    with pytest.raises(WindowError, match="from_settings"):
        WindowedRun(StreamingSession(model, stream_settings), WindowRule(4, 3), 10)
    with pytest.raises(WindowError, match="estimator"):
        WindowedRun(StreamingSession(model, stream_settings), WindowRule(4, 2), 10, estimator="x")
    run = WindowedRun(StreamingSession(model, stream_settings), WindowRule(4, 2, overlap_size=1), 10)
    with pytest.raises(WindowError, match="ended after 5"):
        list(run.frames(images[:5]))
