"""Which attention kernel for the global layers? One frame's global attention of the released
model in steady state (1005 queries x ~72.6k visible keys, 16 heads x 64, bf16), per kernel.

    python bench/attention_kernels.py            # CUDA; FlashInfer optional (variants skipped if absent)

Variants: FlashInfer paged prefill over the cache's real layout (page = one frame of 1005 tokens,
the `auto` backend choice), FlashInfer with page size 1 over separate K and V pools (what a
power-of-two-page kernel such as FA3 needs), and torch SDPA (cuDNN / flash) on contiguous K/V
(what a contiguous anchor + window + special layout would allow). Prints ms per frame for 24 layers
(CUDA events, median of repeats) and the achieved TFLOP/s.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from lingbot_ros.cache import PartialAttention  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1005, help="tokens per frame (queries, page size)")
    ap.add_argument("--frames", type=int, default=72, help="anchor + window frames visible")
    ap.add_argument("--specials", type=int, default=552, help="special tokens visible (6 per evicted frame)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kv-splits", type=int, nargs="*", default=[2, 3, 4, 6, 8],
                    help="KV splits tried for the split-and-merge variant")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("this benchmark times attention kernels on the GPU: it needs a CUDA device")
    dev, dt, H, D, P = "cuda", torch.bfloat16, 16, 64, args.tokens
    keys = args.frames * P + args.specials
    pages = args.frames + (args.specials + P - 1) // P
    q = torch.randn(P, H, D, device=dev, dtype=dt)
    pool = torch.randn(pages, 2, P, H, D, device=dev, dtype=dt)
    k_flat = torch.randn(keys, H, D, device=dev, dtype=dt)
    v_flat = torch.randn(keys, H, D, device=dev, dtype=dt)
    flops = 4 * P * keys * H * D * args.layers
    rows = []

    def add(name, fn):
        try:
            ms = timed(lambda: [fn() for _ in range(args.layers)], args.repeats)
            rows.append((name, f"{ms:.2f}", f"{flops / ms / 1e9:.0f}"))
        except Exception as error:  # a variant this build cannot run is reported, not fatal
            rows.append((name, "n/a", f"{type(error).__name__}: {str(error)[:90]}"))

    qh, kh, vh = q.transpose(0, 1)[None], k_flat.transpose(0, 1)[None], v_flat.transpose(0, 1)[None]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh)
        add(f"torch SDPA {backend.name}, contiguous K/V", sdpa)

    try:
        import flashinfer
    except ImportError:
        flashinfer = None
    if flashinfer is not None:
        workspace = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        last = keys - (pages - 1) * P
        for name, layout, page_size, cache, backend in [
            ("FlashInfer paged, page = frame (1005), auto", "NHD", P, pool, "auto"),
            ("FlashInfer paged, page size 1, separate K/V, fa2", "NHD", 1,
             (k_flat[:, None], v_flat[:, None]), "fa2"),
            ("FlashInfer paged, page size 1, separate K/V, fa3", "NHD", 1,
             (k_flat[:, None], v_flat[:, None]), "fa3"),
        ]:
            try:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, layout, backend=backend)
                n = pages if page_size == P else keys
                wrapper.plan(torch.tensor([0, P], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32),
                             torch.arange(n, dtype=torch.int32),
                             torch.tensor([last if page_size == P else 1], dtype=torch.int32),
                             num_qo_heads=H, num_kv_heads=H, head_dim_qk=D, page_size=page_size,
                             causal=False, q_data_type=dt, kv_data_type=dt)
                add(name, lambda w=wrapper, c=cache: w.run(q, c))
                if page_size == P:
                    reference = wrapper.run(q, cache)
            except Exception as error:
                rows.append((name, "n/a", f"{type(error).__name__}: {str(error)[:90]}"))
        for splits in args.kv_splits:
            # The same queries as `splits` requests, each over a contiguous run of whole pages
            # (only the last run ends with the partial page), merged by log-sum-exp (base 2).
            name = f"FlashInfer paged, page = frame, fa3, KV split into {splits} requests + LSE merge"
            try:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa3")
                bounds = [round(i * pages / splits) for i in range(splits + 1)]
                wrapper.plan(torch.arange(splits + 1, dtype=torch.int32) * P, torch.tensor(bounds, dtype=torch.int32),
                             torch.arange(pages, dtype=torch.int32),
                             torch.tensor([P] * (splits - 1) + [last], dtype=torch.int32),
                             num_qo_heads=H, num_kv_heads=H, head_dim_qk=D, page_size=P,
                             causal=False, q_data_type=dt, kv_data_type=dt)
                q_rep = torch.empty(splits, P, H, D, device=dev, dtype=dt)

                def split_run(w=wrapper, q_rep=q_rep, splits=splits):
                    q_rep.copy_(q.expand(splits, -1, -1, -1))
                    o, lse = w.run(q_rep.view(-1, H, D), pool, return_lse=True)
                    return PartialAttention(o.view(splits, P, H, D), lse.view(splits, P, H)).merge()
                add(name, split_run)
                err = (split_run().float() - reference.float()).abs().max().item()
                rows[-1] = rows[-1] + (f"max abs diff vs unsplit {err:.1e}",)
            except Exception as error:
                rows.append((name, "n/a", f"{type(error).__name__}: {str(error)[:90]}"))
        try:
            add("FlashInfer single prefill (ragged, contiguous), fa3",
                lambda: flashinfer.single_prefill_with_kv_cache(q, k_flat, v_flat, causal=False, backend="fa3"))
        except Exception as error:
            rows.append(("FlashInfer single prefill fa3", "n/a", str(error)[:90]))
    print(f"{P} queries x {keys:,} keys x {H} heads x {D}, bf16, {args.layers} layers per frame "
          f"({flops / 1e12:.2f} TFLOP)\n")
    print("| kernel | ms per frame | TFLOP/s | note |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row + ("",) * (4 - len(row))) + " |")


if __name__ == "__main__":
    main()
