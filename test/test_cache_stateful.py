"""cache/: PagedKVCache against a naive dense reference (spec section 9), random operation
sequences. The reference keeps whole frames in a Python list and special tokens in another,
and applies the visibility rules in the simplest way."""
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from lingbot_ros.cache import (CacheExhausted, CacheSpec, NothingToRollback, PagedKVCache,
                               SpecialStreamFull)


@dataclass
class RefFrame:
    seq: int
    k: list   # per layer [P, H, D]
    v: list


class DenseReference:
    """Spec section 9 semantics with plain lists; knows nothing about pages."""

    def __init__(self, spec):
        self.spec = spec
        self.frames = []                        # retained frames, oldest first
        self.special_k = [[] for _ in range(spec.num_layers)]  # per layer: list of [H, D]
        self.special_v = [[] for _ in range(spec.num_layers)]
        self.records = []                       # deferred steps: (newest seq, left frames, tokens)
        self.next_seq = 0

    @property
    def pending(self):
        return sum(len(evicted) for _, evicted, _ in self.records)

    @property
    def special_count(self):
        return len(self.special_k[0])

    def _kept(self):
        """Special tokens each evicted frame leaves."""
        s = self.spec
        if not s.cross_frame_special:
            return 0
        return 1 if s.camera_only else s.special_tokens

    def _leaving(self, num_new):
        """(dropped, evicted) frames of appending num_new: once more than A + Wn would be
        retained, positions [A, len - Wn) are evicted (they leave their specials) and, without
        anchors, positions [0, A) are dropped (they leave nothing), at every eviction."""
        s = self.spec
        total = len(self.frames) + num_new
        if total <= s.scale_frames + s.sliding_window:
            return [], []
        evicted = self.frames[s.scale_frames:total - s.sliding_window]
        dropped = [] if s.include_scale_frames else self.frames[:s.scale_frames]
        return dropped, evicted

    def expected_error(self, num_new, defer):
        dropped, evicted = self._leaving(num_new)
        cap = self.spec.max_special_tokens
        if cap is not None and self.special_count + self._kept() * len(evicted) > cap:
            return SpecialStreamFull
        if defer and self.pending + len(dropped) + len(evicted) > self.spec.deferred_capacity:
            return CacheExhausted
        used = len(self.frames) + (self.pending if defer else 0)
        if used + num_new > self.spec.frame_pages:
            return CacheExhausted
        return None

    def store(self, ks, vs, defer):
        """ks, vs: per layer [F*P, H, D] of F new frames."""
        s = self.spec
        per = s.tokens_per_frame
        if not defer:
            self.records.clear()      # a non-deferred step executes earlier pending evictions
        num_new = ks[0].shape[0] // per
        dropped, evicted = self._leaving(num_new)   # existing frames only (F <= Wn when evicting)
        for i in range(num_new):
            self.frames.append(RefFrame(self.next_seq, [k[i * per:(i + 1) * per] for k in ks],
                                        [v[i * per:(i + 1) * per] for v in vs]))
            self.next_seq += 1
        n = self._kept()
        for frame in dropped + evicted:
            self.frames.remove(frame)
        for frame in evicted:
            for layer in range(s.num_layers):
                self.special_k[layer].extend(frame.k[layer][:n])
                self.special_v[layer].extend(frame.v[layer][:n])
        if defer and (dropped or evicted):
            self.records.append((self.next_seq - 1, dropped + evicted, n * len(evicted)))

    def rollback(self):
        frame = self.frames.pop()
        self.next_seq = frame.seq
        if self.records and self.records[-1][0] == frame.seq:
            _, evicted, tokens = self.records.pop()
            self.frames = sorted(self.frames + evicted, key=lambda f: f.seq)
            for layer in range(self.spec.num_layers):
                del self.special_k[layer][len(self.special_k[layer]) - tokens:]
                del self.special_v[layer][len(self.special_v[layer]) - tokens:]

    def attend(self, layer, q, current=None):
        """Dense softmax over retained frames (+ the non-keyframe's own K/V) + specials."""
        ks = [f.k[layer] for f in self.frames] + ([current[0]] if current else [])
        vs = [f.v[layer] for f in self.frames] + ([current[1]] if current else [])
        if self.special_k[layer]:
            ks.append(torch.stack(self.special_k[layer]))
            vs.append(torch.stack(self.special_v[layer]))
        keys, values = torch.cat(ks), torch.cat(vs)
        scores = torch.einsum("thd,shd->hts", q, keys) / q.shape[-1] ** 0.5
        return torch.einsum("hts,shd->thd", scores.softmax(-1), values)


def snapshot(cache):
    return cache.stats(), cache.page_census(), [p.shape for p in
                                               (cache.layer_pool(i) for i in range(cache.spec.num_layers))]


class CacheMachine(RuleBasedStateMachine):
    @initialize(layers=st.integers(1, 2), heads=st.integers(1, 2), head_dim=st.sampled_from([4, 8]),
                per_frame=st.integers(4, 7), specials=st.integers(1, 3),
                anchors=st.integers(0, 3), window=st.integers(1, 4), deferred=st.integers(0, 4),
                chunk=st.integers(1, 2), cap=st.none() | st.integers(0, 24),
                flags=st.tuples(st.booleans(), st.booleans(), st.booleans()), defer=st.booleans())
    def setup(self, layers, heads, head_dim, per_frame, specials, anchors, window, deferred,
              chunk, cap, flags, defer):
        cross, include, camera_only = flags
        self.spec = CacheSpec(num_layers=layers, num_heads=heads, head_dim=head_dim,
                              tokens_per_frame=per_frame, special_tokens=specials,
                              scale_frames=anchors, sliding_window=window,
                              cross_frame_special=cross, include_scale_frames=include,
                              camera_only=camera_only, deferred_capacity=deferred,
                              special_chunk_pages=chunk, max_special_tokens=cap,
                              dtype=torch.float64)
        self.cache = PagedKVCache(self.spec, backend="torch")
        self.cache.defer_evictions = defer
        self.ref = DenseReference(self.spec)

    # ---- helpers ----------------------------------------------------------------------------

    def _qkv(self, seed, num_frames):
        g = torch.Generator().manual_seed(seed)
        s = self.spec
        shape = (num_frames * s.tokens_per_frame, s.num_heads, s.head_dim)
        return [[torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3)]
                for _ in range(s.num_layers)]

    def _refused(self, call, error):
        before = snapshot(self.cache)
        with pytest.raises(error):
            call()
        assert snapshot(self.cache) == before, "a refused operation changed the cache"

    def _run_step(self, num_frames, store, seed, check_against=None):
        """begin_step + attend on every layer; compare with the reference (or `check_against`)."""
        ref = check_against or self.ref
        defer = self.cache.defer_evictions
        if store:
            error = ref.expected_error(num_frames, defer)
            if error is not None:
                self._refused(lambda: self.cache.begin_step(num_frames, store=True), error)
                return False
        qkv = self._qkv(seed, num_frames)
        self.cache.begin_step(num_frames, store=store)
        if store:
            ref.store([k for _, k, _ in qkv], [v for _, _, v in qkv], defer)
        for layer, (q, k, v) in enumerate(qkv):
            out = self.cache.attend(layer, q, k, v)
            expected = ref.attend(layer, q, None if store else (k, v))
            torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
        self._check_pages(ref, None if store else qkv)
        return True

    def _check_pages(self, ref, current):
        """Visible pages in order hold the reference's frames, then the scratch page, then the
        special stream; only the last page may be partial."""
        s, table, census = self.spec, self.cache.step_table, self.cache.page_census()
        per = s.tokens_per_frame
        used_special = -(-ref.special_count // per)
        expected_pages = (census["anchor"] + census["window"]
                          + (census["scratch"] if current else []) + census["special"][:used_special])
        visible = table.host_pages.tolist()
        assert visible == expected_pages
        assert table.pages.tolist() == visible
        assert table.host_kv_indptr.tolist() == [0, len(visible)]
        last = ref.special_count - (used_special - 1) * per if used_special else per
        assert table.host_last_page_len.item() == last
        assert table.num_kv_tokens == (len(ref.frames) + bool(current)) * per + ref.special_count
        for layer in range(s.num_layers):
            pool = self.cache.layer_pool(layer)
            for page, frame in zip(visible, ref.frames):
                assert torch.equal(pool[page, 0], frame.k[layer])
                assert torch.equal(pool[page, 1], frame.v[layer])
            if current:
                assert torch.equal(pool[s.scratch_page, 0], current[layer][1])
            if ref.special_count:
                rows = pool[census["special"][0]:, :].transpose(0, 1).reshape(2, -1, s.num_heads, s.head_dim)
                assert torch.equal(rows[0, :ref.special_count], torch.stack(ref.special_k[layer]))
                assert torch.equal(rows[1, :ref.special_count], torch.stack(ref.special_v[layer]))

    # ---- rules ------------------------------------------------------------------------------

    @rule(seeds=st.lists(st.integers(0, 2**31), min_size=1, max_size=4),
          defer=st.sampled_from([None, False, True]))
    def keyframes(self, seeds, defer):
        """Several keyframe steps (streams reach eviction quickly), maybe toggling deferral."""
        if defer is not None:
            self.cache.defer_evictions = defer
        for seed in seeds:
            self._run_step(1, True, seed)

    @rule(seed=st.integers(0, 2**31))
    def non_keyframe(self, seed):
        self._run_step(1, False, seed)

    @precondition(lambda self: self.cache.num_stored_frames == 0)
    @rule(frames=st.integers(1, 7), seed=st.integers(0, 2**31))
    def phase_one(self, frames, seed):
        s = self.spec
        self._run_step(1 + (frames - 1) % (s.scale_frames + s.sliding_window), True, seed)

    @rule(defer=st.booleans())
    def set_defer(self, defer):
        self.cache.defer_evictions = defer

    @rule()
    def flush(self):
        assert self.cache.flush() == self.ref.pending
        self.ref.records.clear()

    @rule()
    def rollback(self):
        if not self.ref.frames:
            self._refused(self.cache.rollback_last_frame, NothingToRollback)
            return
        self.cache.rollback_last_frame()
        self.ref.rollback()

    @rule()
    def reset(self):
        """Empty, every buffer kept: the special pages the stream grew to stay allocated."""
        pages, version = self.cache.stats().special_pages, self.cache.buffers_version
        self.cache.reset()
        self.ref = DenseReference(self.spec)
        assert self.cache.stats().special_pages == pages
        assert self.cache.buffers_version == version

    @rule(seed=st.integers(0, 2**31))
    def deferred_append_then_rollback(self, seed):
        """With deferral on, append + rollback leaves the cache as if the frame never came:
        self.ref never sees it, and every later output is compared with self.ref."""
        self.cache.defer_evictions = True
        shadow = DenseReference(self.spec)   # a throwaway copy that does see the frame
        shadow.frames, shadow.records = list(self.ref.frames), list(self.ref.records)
        shadow.special_k = [list(x) for x in self.ref.special_k]
        shadow.special_v = [list(x) for x in self.ref.special_v]
        shadow.next_seq = self.ref.next_seq
        def state():
            census = self.cache.page_census()
            del census["special"]             # the step may have grown the special stream
            stats = self.cache.stats()
            return census, (stats.frames_stored, stats.pending_pages, stats.special_tokens)

        before = state()
        if self._run_step(1, True, seed, check_against=shadow):
            self.cache.rollback_last_frame()
            assert state() == before

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def pages_conserved(self):
        if not hasattr(self, "cache"):
            return
        s, census, stats = self.spec, self.cache.page_census(), self.cache.stats()
        every = [page for pages in census.values() for page in pages]
        assert sorted(every) == list(range(s.patch_pages + stats.special_pages)), census
        assert census["scratch"] == [s.scratch_page]
        assert len(census["anchor"]) + len(census["window"]) == len(self.ref.frames)
        assert len(census["pending"]) <= s.deferred_capacity
        assert stats.special_tokens == self.ref.special_count
        assert stats.special_pages * s.tokens_per_frame >= stats.special_tokens
        assert stats.frames_stored == self.cache.num_stored_frames == len(self.ref.frames)
        assert stats.pending_pages == self.ref.pending

CacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestPagedKVCacheAgainstDenseReference = CacheMachine.TestCase
