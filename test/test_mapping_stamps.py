"""mapping/stamps.py: the image stamp rule (accept, drop jitter, hold a forward jump until the next
frame decides, restart on a confirmed jump or a jump back), driven as the Mapper drives it."""
from hypothesis import given, settings
from hypothesis import strategies as st

from lingbot_ros.mapping.stamps import ACCEPT, DROP, NS_PER_S, REFUSE, RESTART, StampPolicy

GAP_S, JITTER_S = 5.0, 0.5


class Stream:
    """The Mapper's use of the rule: a restart replaces the policy, a frame taken is accepted.
    Items are the frames' positions in the input."""

    def __init__(self):
        self.policy = StampPolicy(GAP_S, JITTER_S)
        self.taken, self.dropped, self.refused, self.restarts = [], [], [], []
        self.received = 0

    def feed(self, stamp_s: float, gap_s: float | None = None) -> list[str]:
        item = self.received
        self.received += 1
        steps = self.policy.decide(round(stamp_s * NS_PER_S), None if gap_s is None else round(gap_s * NS_PER_S), item)
        for verdict, frame in steps:
            if verdict.action == DROP:
                self.dropped.append(frame)
            elif verdict.action == REFUSE:
                self.refused.append((frame, verdict.reason))
            else:
                if verdict.action == RESTART:
                    self.policy = StampPolicy(GAP_S, JITTER_S)
                    self.restarts.append((frame, verdict.reason))
                self.policy.accept(self._stamps[frame])
                self.taken.append(frame)
        return [verdict.action for verdict, _ in steps]

    def run(self, stamps_s) -> "Stream":
        self._stamps = [round(s * NS_PER_S) for s in stamps_s]
        for stamp_s in stamps_s:
            self.feed(stamp_s)
        return self


def test_a_single_frame_an_hour_ahead_is_refused_without_a_restart():
    stream = Stream().run([100.0, 100.1, 3700.2, 100.3, 100.4])
    assert stream.restarts == [] and stream.taken == [0, 1, 3, 4] and stream.dropped == []
    [(frame, reason)] = stream.refused
    assert frame == 2 and "jumped 3600.100 s ahead" in reason and "the next frame did not follow" in reason


def test_a_real_jump_is_confirmed_by_the_next_frame_and_restarts_once_at_the_held_frame():
    stream = Stream()
    stream._stamps = [round(s * NS_PER_S) for s in (100.0, 100.1, 3700.0, 3700.1, 3700.2)]
    assert stream.feed(100.0) == [ACCEPT] and stream.feed(100.1) == [ACCEPT]
    assert stream.feed(3700.0) == [] and stream.policy.held == 1          # held: the next frame decides
    assert stream.feed(3700.1) == [RESTART, ACCEPT] and stream.policy.held == 0
    assert stream.feed(3700.2) == [ACCEPT]
    assert stream.taken == [0, 1, 2, 3, 4] and stream.refused == []
    assert stream.restarts == [(2, "gap of 3599.900 s between image stamps (max_stamp_gap_s=5)")]


def test_jitter_is_dropped_a_jump_back_restarts_and_a_held_frame_can_end_unconfirmed():
    stream = Stream().run([100.0, 100.2, 100.1, 100.3, 50.0, 50.1])
    assert stream.dropped == [2] and [frame for frame, _ in stream.restarts] == [4]
    assert stream.taken == [0, 1, 3, 4, 5]
    # A held frame followed by a frame that jumps back: the held one refused, then the restart.
    stream = Stream().run([100.0, 200.0, 10.0])
    assert [frame for frame, _ in stream.refused] == [1] and [frame for frame, _ in stream.restarts] == [2]
    # Two frames that follow each other far ahead: a real jump; one more after an outlier holds again.
    stream = Stream().run([100.0, 200.0, 300.0, 300.1])
    assert [frame for frame, _ in stream.refused] == [1] and [frame for frame, _ in stream.restarts] == [2]
    stream = Stream().run([100.0, 3700.0])
    verdict, frame = stream.policy.unconfirmed()
    assert (verdict.action, frame) == (REFUSE, 1) and "no frame followed" in verdict.reason
    assert stream.policy.held == 0 and stream.policy.unconfirmed() is None


def test_a_duplicate_stamp_is_dropped_and_never_taken_twice():
    # t, t, t + 1 ns: the second frame of the instant is dropped (two poses at one stamp otherwise).
    t = 1_700_000_000.0
    stream = Stream()
    stream._stamps = [round(t * NS_PER_S)] * 2 + [round(t * NS_PER_S) + 1]
    assert stream.feed(t) == [ACCEPT]
    steps = stream.policy.decide(stream._stamps[1], None, 1)
    assert [(v.action, v.reason) for v, _ in steps] == [(DROP, "stamp equal to the previous frame's (a duplicate): "
                                                                "dropped")]
    assert stream.policy.decide(stream._stamps[2], None, 2)[0][0].action == ACCEPT
    # A duplicate of a held frame: dropped, the held one stays held and the next frame decides.
    stream = Stream()
    stream._stamps = [round(s * NS_PER_S) for s in (100.0, 3700.0, 3700.0, 3700.1)]
    for stamp_s in (100.0, 3700.0, 3700.0, 3700.1):
        stream.feed(stamp_s)
    assert stream.dropped == [2] and stream.taken == [0, 1, 3] and [f for f, _ in stream.restarts] == [1]


def test_an_outlier_among_frames_a_front_end_skipped_does_not_count_as_a_gap():
    # Newest frame wins: the frame after an outlier carries the outlier's received gap (3600 s),
    # but its own stamp is 0.2 s after the previous one: the stamps' difference bounds the gap.
    stream = Stream()
    stream._stamps = [round(100.0 * NS_PER_S), round(100.2 * NS_PER_S)]
    stream.feed(100.0)
    assert stream.feed(100.2, gap_s=3600.0) == [ACCEPT] and stream.restarts == []


steps = st.one_of(st.floats(0.0, 0.3),            # ordinary frames
                  st.just(0.0),                   # duplicates
                  st.floats(-0.6, 0.0),           # jitter and a little more
                  st.floats(4.0, 7.0),            # around max_stamp_gap_s
                  st.floats(-4000.0, 4000.0))     # clock jumps either way


@settings(max_examples=300, deadline=None)
@given(start=st.floats(1.0, 1e6), deltas=st.lists(steps, max_size=40))
def test_any_stamp_sequence_accounts_for_every_frame_once_in_order(start, deltas):
    stamps = [start]
    for delta in deltas:
        stamps.append(max(stamps[-1] + delta, 0.001))
    stream = Stream().run(stamps)
    refused = [frame for frame, _ in stream.refused]
    held = stream.policy.held
    assert held <= 1
    # The input ends: a held frame is refused (not always the newest: a duplicate after it was dropped).
    ended = stream.policy.unconfirmed()
    refused += [] if ended is None else [ended[1]]
    assert len(stream.taken) + len(stream.dropped) + len(refused) == stream.received
    assert sorted(stream.taken + stream.dropped + refused) == list(range(stream.received))
    assert stream.taken == sorted(stream.taken)                     # in input order
    taken_stamps = [round(stamps[frame] * NS_PER_S) for frame in stream.taken]
    restarted_at = {frame for frame, _ in stream.restarts}
    assert all(b != a or frame in restarted_at for a, b, frame in zip(taken_stamps, taken_stamps[1:],
                                                                      stream.taken[1:])), "a stamp taken twice"
    # Every frame taken follows the one taken before it, or a restart begins at it.
    restarted = {frame for frame, _ in stream.restarts}
    for previous, frame in zip(stream.taken, stream.taken[1:]):
        step = stamps[frame] - stamps[previous]
        assert frame in restarted or -1e-6 <= step <= GAP_S + 1e-6, (previous, frame, step)


@settings(max_examples=300, deadline=None)
@given(start=st.floats(1.0, 1e6), deltas=st.lists(st.floats(0.001, 1.0), min_size=2, max_size=30),
       position=st.integers(1, 29), jump=st.floats(GAP_S + 0.01, 1e5))
def test_an_isolated_outlier_never_restarts_and_is_the_only_frame_refused(start, deltas, position, jump):
    stamps = [start]
    for delta in deltas:
        stamps.append(stamps[-1] + delta)
    position = min(position, len(stamps) - 2)   # a frame follows it
    stamps[position] = stamps[position - 1] + jump
    stream = Stream().run(stamps)
    assert stream.restarts == [] and stream.dropped == []
    assert [frame for frame, _ in stream.refused] == [position]
    assert stream.taken == [i for i in range(len(stamps)) if i != position]
