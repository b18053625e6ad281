"""What beam search's attention calls cost on this GPU, per attention backend and dtype.

    python benchmarks/sdpa_probe.py            # on a CUDA machine; prints one table

Beam search calls scaled_dot_product_attention with a new key length at every decoding step (the
decoder's self-attention keys grow by one token) and a new row count with every batch of another
size. This replays that pattern for an opus-mt-sized decoder layer (8 heads of 64, a padding mask
as generate() passes it) for a few batch sizes and 64 steps, and times it with each backend
allowed: the default choice, and the default without cuDNN's (what the HF engine allows, see
seq2seq_eval/engines/hf.py attention_backends). A second pass over the same shapes shows what is
left once every shape has been seen.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time


def replay(torch, rows_list, steps, heads, dim, dtype, device):
    for rows in rows_list:
        mask = torch.zeros((rows, 1, 1, steps), dtype=dtype, device=device)
        for length in range(1, steps + 1):
            q = torch.randn((rows, heads, 1, dim), dtype=dtype, device=device)
            k = torch.randn((rows, heads, length, dim), dtype=dtype, device=device)
            torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask[..., :length])
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="256,240,224", help="decoder rows (examples x beams) per batch")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--device", default="cuda", help="cpu only checks this script")
    a = p.parse_args(argv)
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("sdpa_probe.py: no CUDA GPU", file=sys.stderr)
        return 3
    rows_list = [int(x) for x in a.rows.split(",")]
    no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU'}; "
          f"cuDNN attention enabled: {torch.backends.cuda.cudnn_sdp_enabled()}")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # CUDA context, handles, first kernels
        replay(torch, [8], 4, 8, 64, dtype, device)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            # A decoding-sized call: for a 9-row, one-key call torch 2.11 chose efficient attention
            # even where it chose cuDNN for beam search's real shapes.
            replay(torch, [rows_list[0] + 7], 16, 8, 64, dtype, device)
        chosen = sorted({e.key for e in prof.key_averages() if "attention" in e.key and e.key.startswith("aten::_")})
        print(f"{str(dtype).replace('torch.', '')}: default backend op {', '.join(chosen) or '?'}")
    print(f"{len(rows_list)} batch sizes x {a.steps} steps = {len(rows_list) * a.steps} calls")
    print(f"{'dtype':<10}{'backends':<22}{'first pass s':>14}{'second pass s':>15}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for label, ctx in (("default", contextlib.nullcontext), ("without cuDNN", lambda: sdpa_kernel(no_cudnn))):
            with ctx():
                # New row counts for every (dtype, backends) pair, so the first pass meets unseen shapes.
                shift = 1 + 2 * (dtype is torch.float16) + 4 * (dtype is torch.bfloat16) + (label == "default")
                rows = [r - shift for r in rows_list]
                t0 = time.perf_counter()
                replay(torch, rows, a.steps, 8, 64, dtype, device)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                replay(torch, rows, a.steps, 8, 64, dtype, device)
                second = time.perf_counter() - t0
            print(f"{str(dtype).replace('torch.', ''):<10}{label:<22}{first:>14.3f}{second:>15.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
