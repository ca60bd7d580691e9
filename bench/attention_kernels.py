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


E4M3_MAX = 448.0


def to_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """x in float8 e4m3 with one scale (amax / 448), and that scale."""
    scale = max(x.abs().amax().item() / E4M3_MAX, 1e-12)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def fp8_rows(flashinfer, workspace, add, rows, q, pool, k_flat, v_flat, pages, last, args) -> None:
    """FP8 (e4m3) K/V, and Q where the kernel takes it: time per frame and the relative error of
    one layer's output against float32 attention, beside the bf16 kernel's own error."""
    P, H, D = q.shape
    e4m3, dt = torch.float8_e4m3fn, torch.bfloat16
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], k_flat.float().transpose(0, 1)[None],
        v_flat.float().transpose(0, 1)[None])[0].transpose(0, 1)
    pool8 = torch.empty(pool.shape, dtype=e4m3, device=pool.device)
    _, k_scale = to_e4m3(pool[:, 0])
    _, v_scale = to_e4m3(pool[:, 1])
    pool8[:, 0] = (pool[:, 0].float() / k_scale).clamp(-E4M3_MAX, E4M3_MAX).to(e4m3)
    pool8[:, 1] = (pool[:, 1].float() / v_scale).clamp(-E4M3_MAX, E4M3_MAX).to(e4m3)
    q_scale = max(q.abs().amax().item() / E4M3_MAX, 1e-12)
    for splits in sorted({1, *args.kv_splits} & {1, 4}):
        for backend, q_fp8 in (("fa3", True), ("fa2", False), ("auto", False)):
            name = (f"FlashInfer paged, page = frame, {backend}, {'q/k/v' if q_fp8 else 'k/v'} e4m3"
                    f"{'' if q_fp8 else ' (q bf16)'}, {splits} request(s)")
            try:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
                bounds = [round(i * pages / splits) for i in range(splits + 1)]
                wrapper.plan(torch.arange(splits + 1, dtype=torch.int32) * P,
                             torch.tensor(bounds, dtype=torch.int32), torch.arange(pages, dtype=torch.int32),
                             torch.tensor([P] * (splits - 1) + [last], dtype=torch.int32),
                             num_qo_heads=H, num_kv_heads=H, head_dim_qk=D, page_size=P, causal=False,
                             q_data_type=e4m3 if q_fp8 else dt, kv_data_type=e4m3, o_data_type=dt)
                q_rep = torch.empty(splits, P, H, D, device=q.device, dtype=e4m3 if q_fp8 else dt)

                def run(w=wrapper, q_rep=q_rep, splits=splits, q_fp8=q_fp8):
                    if q_fp8:
                        q_rep.copy_((q.float() / q_scale).clamp(-E4M3_MAX, E4M3_MAX).expand(splits, -1, -1, -1))
                    else:
                        q_rep.copy_(q.expand(splits, -1, -1, -1))
                    o, lse = w.run(q_rep.view(-1, H, D), pool8, q_scale=q_scale if q_fp8 else None,
                                   k_scale=k_scale, v_scale=v_scale, return_lse=True)
                    return PartialAttention(o.view(splits, P, H, D), lse.view(splits, P, H)).merge()
                add(name, run)
                rows[-1] = rows[-1] + (f"rel. error vs fp32 {relative_error(run(), ref):.2e}",)
            except Exception as error:
                rows.append((name, "n/a", f"{type(error).__name__}: {str(error)[:120]}"))
    # The bf16 kernel the cache runs, for the error beside the FP8 rows.
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa3")
    wrapper.plan(torch.tensor([0, P], dtype=torch.int32), torch.tensor([0, pages], dtype=torch.int32),
                 torch.arange(pages, dtype=torch.int32), torch.tensor([last], dtype=torch.int32),
                 num_qo_heads=H, num_kv_heads=H, head_dim_qk=D, page_size=P, causal=False,
                 q_data_type=dt, kv_data_type=dt)
    rows.append(("(bf16 fa3, 1 request: error only)", "", "",
                 f"rel. error vs fp32 {relative_error(wrapper.run(q, pool), ref):.2e}"))


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
    # Logits with a spread of a few units (not near-uniform attention), so that the error rows
    # measure something; the pool holds the same keys and values as the contiguous tensors.
    q = (2 * torch.randn(P, H, D, device=dev)).to(dt)
    k_flat = torch.randn(keys, H, D, device=dev, dtype=dt)
    v_flat = torch.randn(keys, H, D, device=dev, dtype=dt)
    pool = torch.zeros(pages, 2, P, H, D, device=dev, dtype=dt)
    for i, flat in enumerate((k_flat, v_flat)):
        padded = torch.zeros(pages * P, H, D, device=dev, dtype=dt)
        padded[:keys] = flat
        pool[:, i] = padded.view(pages, P, H, D)
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
        fp8_rows(flashinfer, workspace, add, rows, q, pool, k_flat, v_flat, pages, last, args)
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
