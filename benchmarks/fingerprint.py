"""What evaluate()'s ranks pay to compare their weights: model/fingerprint.py's weights_fingerprint
on a model of 1B parameters, on one core, in float32 and bfloat16.

The "model" is a module holding tensors of a 1B-parameter decoder's sizes (d_model 2048, FFN 8192,
20 layers, a 32,000-token embedding), filled with random values: the fingerprint reads bytes, so
what the weights mean does not matter, only how many bytes and in how many tensors.

    python benchmarks/fingerprint.py [--layers 20] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from seq2seq_eval.model.fingerprint import weights_fingerprint


def model_of(layers: int, dtype: torch.dtype, d: int = 2048, ffn: int = 8192, vocab: int = 32000) -> torch.nn.Module:
    module = torch.nn.Module()
    module.register_buffer("embed", torch.empty(vocab, d, dtype=dtype).uniform_())
    for i in range(layers):
        for name, shape in (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)), ("up", (ffn, d)),
                            ("down", (d, ffn)), ("norm1", (d,)), ("norm2", (d,))):
            module.register_buffer(f"layer{i}_{name}", torch.empty(shape, dtype=dtype).uniform_())
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = model_of(args.layers, dtype)
        n = sum(t.numel() for t in model.state_dict().values())
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            weights_fingerprint(model)
            times.append(time.perf_counter() - t0)
        gb = n * torch.tensor([], dtype=dtype).element_size() / 1e9
        results[str(dtype).removeprefix("torch.")] = {
            "parameters": n, "tensors": len(model.state_dict()), "GB": round(gb, 2), "seconds": round(min(times), 2),
            "seconds_per_GB": round(min(times) / gb, 3), "seconds_per_1e9_parameters": round(min(times) / n * 1e9, 2)}
        del model
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
