"""The GPU step-cost probe: milliseconds per decode step and per prefill of a Qwen2 decoder with
random weights, measured with plain PyTorch (no vLLM), written as one latency file.

Why: `LatencyModel` needs a GPU's step costs, and the machines at hand may hold PyTorch alone
(vLLM cannot be installed there). Imports: torch and the standard library only, plus the
stdlib-only fit (`sprint.latency.stepfit`), so it runs from a checkout with nothing else installed:

    python -m sprint.latency.probe --shape r1-distill-qwen-7b --out h100.json   # in the checkout's root
    sprint gpu-probe --shape tiny --out tiny.json                              # finds a Python with torch

What it measures (the file's `method` says so):

- decode: k sequences each at context L take one step together; under CUDA each step is a captured
  CUDA graph (what vLLM replays), on a CPU the same code runs eagerly. Attention in decode is two
  batched matmuls that read K and V once per KV head (`--attention matmul`, the default), or
  `scaled_dot_product_attention` (`sdpa`), whose kernel may set the figure instead of the GPU;
- prefill: `new` tokens after `cached` ones, batch 1, eager, attention in query chunks;
- the two ceilings: the device's copy bandwidth (bytes read + written) and its matmul rate.

A time cap stops the grid where it is (the cells measured are kept), and a line per cell shows progress.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from sprint.latency.shapes import SHAPES, parameter_count
from sprint.latency.stepfit import fit_step_table

GPU_GRID = {"batch_sizes": [1, 2, 3, 4, 6, 8, 12, 16], "contexts": [512, 2048, 4096, 8192, 16384],
            "prefill": [(0, 128), (0, 512), (0, 2048), (0, 8192), (0, 16384), (2048, 16), (2048, 64), (2048, 256),
                        (8192, 16), (8192, 64), (8192, 256)]}
SMALL_GRID = {"batch_sizes": [1, 2, 4], "contexts": [32, 128], "prefill": [(0, 16), (0, 64), (64, 8)]}


@dataclass
class ProbeSettings:
    """What to measure, and how long it may take."""

    shape: dict[str, int]
    shape_name: str
    batch_sizes: list[int]
    contexts: list[int]
    prefill: list[tuple[int, int]]  # (cached, new)
    device: str = "cuda"
    dtype: str = "bfloat16"
    attention: str = "matmul"  # matmul | sdpa
    graphs: bool = True  # capture decode steps as CUDA graphs (CUDA only)
    repeats: int = 30  # timed replays per decode cell
    time_cap_s: float = 600.0
    seed: int = 0


def shape_from_config(path: Path) -> dict[str, int]:
    """The decoder shape of a model folder's config.json (Hugging Face names)."""
    cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text(encoding="utf-8"))
    heads = int(cfg["num_attention_heads"])
    return {"hidden": int(cfg["hidden_size"]), "inter": int(cfg["intermediate_size"]),
            "layers": int(cfg["num_hidden_layers"]), "heads": heads,
            "kv": int(cfg.get("num_key_value_heads") or heads),
            "hd": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads), "vocab": int(cfg["vocab_size"])}


class Decoder:
    """A Qwen2 decoder with random weights: just enough to cost what the real one costs per step."""

    def __init__(self, s: dict[str, int], device: str, dtype: torch.dtype, attention: str) -> None:
        self.s, self.device, self.dtype, self.attention = s, device, dtype, attention
        h, q, kv = s["hidden"], s["heads"] * s["hd"], s["kv"] * s["hd"]

        def w(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0, 0.02)

        self.embed, self.head, self.norm = w(s["vocab"], h), w(h, s["vocab"]), torch.ones(h, device=device, dtype=dtype)
        self.layers = [{"qkv": w(h, q + 2 * kv), "qkv_b": w(q + 2 * kv), "o": w(q, h), "gate_up": w(h, 2 * s["inter"]),
                        "down": w(s["inter"], h), "n1": torch.ones(h, device=device, dtype=dtype),
                        "n2": torch.ones(h, device=device, dtype=dtype)} for _ in range(s["layers"])]
        inv = 1.0 / (1e6 ** (torch.arange(0, s["hd"], 2, device=device, dtype=torch.float32) / s["hd"]))
        self.inv_freq = inv

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(self.dtype) * weight

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x (..., n, hd) at `positions` (n,)."""
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1).to(self.dtype), torch.cat([angles.sin()] * 2, -1).to(self.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q (b, kv, group·n, hd) against k, v (b, kv, L, hd): K and V read once per KV head."""
        if self.attention == "sdpa":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores.float(), -1).to(self.dtype), v)

    def _mlp(self, layer: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.matmul(self._norm(x, layer["n2"]), layer["gate_up"]).chunk(2, -1)
        return torch.matmul(torch.nn.functional.silu(gate) * up, layer["down"])

    def _qkv(self, layer: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.s
        qkv = torch.matmul(self._norm(x, layer["n1"]), layer["qkv"]) + layer["qkv_b"]
        return qkv.split([s["heads"] * s["hd"], s["kv"] * s["hd"], s["kv"] * s["hd"]], -1)

    def decode_step(self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]],
                    position: torch.Tensor) -> torch.Tensor:
        """One step for k sequences (tokens (k,)), each with a cache (k, kv, L + 1, hd) whose last slot it fills."""
        s = self.s
        k, group = tokens.shape[0], s["heads"] // s["kv"]
        x = self.embed[tokens]
        for layer, (kc, vc) in zip(self.layers, cache):
            q, kn, vn = self._qkv(layer, x)
            q = self._rope(q.view(k, s["heads"], 1, s["hd"]), position)
            kn = self._rope(kn.view(k, s["kv"], 1, s["hd"]), position)
            kc[:, :, -1:].copy_(kn)
            vc[:, :, -1:].copy_(vn.view(k, s["kv"], 1, s["hd"]))
            out = self._attend(q.view(k, s["kv"], group, s["hd"]), kc, vc, None)
            x = x + torch.matmul(out.reshape(k, -1), layer["o"])
            x = x + self._mlp(layer, x)
        return torch.matmul(self._norm(x, self.norm), self.head)

    def prefill(self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], cached: int,
                chunk: int = 2048) -> torch.Tensor:
        """`tokens` (n,) after `cached` tokens already in the cache (1, kv, cached + n, hd); queries in chunks."""
        s = self.s
        n, group = tokens.shape[0], s["heads"] // s["kv"]
        positions = torch.arange(cached, cached + n, device=self.device)
        x = self.embed[tokens]
        for layer, (kc, vc) in zip(self.layers, cache):
            q, kn, vn = self._qkv(layer, x)
            q = self._rope(q.view(n, s["heads"], s["hd"]).transpose(0, 1), positions)  # (heads, n, hd)
            kc[0, :, cached:] = self._rope(kn.view(n, s["kv"], s["hd"]).transpose(0, 1), positions)
            vc[0, :, cached:] = vn.view(n, s["kv"], s["hd"]).transpose(0, 1)
            outs = []
            for i0 in range(0, n, chunk):
                i1 = min(n, i0 + chunk)
                keys = cached + i1
                qc = q[:, i0:i1].reshape(s["kv"], group * (i1 - i0), s["hd"])[None]
                rows = torch.arange(cached + i0, cached + i1, device=self.device).repeat(group)
                mask = torch.arange(keys, device=self.device)[None, :] <= rows[:, None]
                out = self._attend(qc, kc[:, :, :keys], vc[:, :, :keys], mask[None, None])
                outs.append(out[0].view(s["kv"], group, i1 - i0, s["hd"]).permute(2, 0, 1, 3).reshape(i1 - i0, -1))
            x = x + torch.matmul(torch.cat(outs), layer["o"])
            x = x + self._mlp(layer, x)
        return torch.matmul(self._norm(x[-1:], self.norm), self.head)

    def cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.s
        return [(torch.empty(batch, s["kv"], length, s["hd"], device=self.device, dtype=self.dtype).normal_(),
                 torch.empty(batch, s["kv"], length, s["hd"], device=self.device, dtype=self.dtype).normal_())
                for _ in range(s["layers"])]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_ms(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of `fn` (CUDA: events around `repeats` calls; CPU: the median call)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def decode_cell(model: Decoder, k: int, length: int, cfg: ProbeSettings, eager_too: bool) -> dict[str, Any]:
    """One decode cell: k sequences at context `length` stepping together."""
    cache = model.cache(k, length + 1)
    tokens = torch.zeros(k, dtype=torch.long, device=model.device)
    position = torch.tensor([length], device=model.device)
    kv_bytes = 2 * model.s["layers"] * k * model.s["kv"] * (length + 1) * model.s["hd"] * cache[0][0].element_size()
    graphs = cfg.graphs and cfg.device.startswith("cuda")
    eager: float | None = None
    with torch.inference_mode():
        if eager_too or not graphs:
            eager = timed_ms(lambda: model.decode_step(tokens, cache, position), cfg.device, max(3, cfg.repeats // 5))
        step = eager
        if graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model.decode_step(tokens, cache, position)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model.decode_step(tokens, cache, position)
            step = timed_ms(graph.replay, cfg.device, cfg.repeats)
            del graph
    del cache
    return {"k": k, "L": length, "step_ms": step, "eager_ms": eager if eager_too else None, "kv_read_GB": kv_bytes / 1e9}


def prefill_cell(model: Decoder, cached: int, new: int, cfg: ProbeSettings) -> dict[str, Any]:
    cache = model.cache(1, cached + new)
    tokens = torch.zeros(new, dtype=torch.long, device=model.device)
    with torch.inference_mode():
        ms = timed_ms(lambda: model.prefill(tokens, cache, cached), cfg.device, 3, warmup=1)
    del cache
    return {"cached": cached, "new": new, "ms": ms}


def ceilings(device: str, dtype: torch.dtype) -> tuple[float, float]:
    """The device's copy bandwidth (TB/s, bytes read + written) and matmul rate (TFLOP/s)."""
    big = device.startswith("cuda")
    x = torch.empty((256 if big else 8) * 2**20, device=device, dtype=torch.float16).normal_()
    y = torch.empty_like(x)
    ms = timed_ms(lambda: y.copy_(x), device, 20 if big else 5)
    copy = 2 * x.numel() * x.element_size() / (ms / 1000) / 1e12
    n = 8192 if big else 256
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    ms = timed_ms(lambda: torch.matmul(a, b), device, 20 if big else 5)
    return copy, 2 * n**3 / (ms / 1000) / 1e12


def run_probe(cfg: ProbeSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure the grid (stopping at the time cap) and return the latency file's contents."""
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    cuda = cfg.device.startswith("cuda")
    name = torch.cuda.get_device_name(cfg.device) if cuda else f"CPU ({platform.processor() or platform.machine()})"
    log(f"probe: {name}, shape {cfg.shape_name} ({parameter_count(cfg.shape) / 1e9:.3g}B parameters), {cfg.dtype}, "
        f"attention {cfg.attention}, {'CUDA graphs' if cfg.graphs and cuda else 'eager'}")
    model = Decoder(cfg.shape, cfg.device, dtype, cfg.attention)
    copy, rate = ceilings(cfg.device, dtype)
    log(f"  ceilings: copy {copy:.3g} TB/s, matmul {rate:.3g} TFLOP/s ({time.perf_counter() - t0:.1f} s)")
    cells = [(k, L) for L in cfg.contexts for k in cfg.batch_sizes]
    decode, prefill, skipped = [], [], 0
    for i, (k, length) in enumerate(cells):
        if time.perf_counter() - t0 > cfg.time_cap_s:
            skipped += len(cells) - i
            break
        eager_too = length == min(cfg.contexts) and k in (1, 4)
        decode.append(decode_cell(model, k, length, cfg, eager_too))
        log(f"  decode k={k:<3} L={length:<6} {decode[-1]['step_ms']:8.3f} ms   "
            f"[{i + 1}/{len(cells)}, {time.perf_counter() - t0:.1f} s]")
    for j, (cached, new) in enumerate(cfg.prefill):
        if time.perf_counter() - t0 > cfg.time_cap_s:
            skipped += len(cfg.prefill) - j
            break
        prefill.append(prefill_cell(model, cached, new, cfg))
        log(f"  prefill cached={cached:<6} new={new:<6} {prefill[-1]['ms']:8.3f} ms   "
            f"[{j + 1}/{len(cfg.prefill)}, {time.perf_counter() - t0:.1f} s]")
    if skipped:
        log(f"  time cap of {cfg.time_cap_s:g} s reached: {skipped} cells not measured")
    graphs = cfg.graphs and cuda
    out: dict[str, Any] = {
        "format": "sprint-latency/1", "device": name, "torch": torch.__version__, "python": sys.version.split()[0],
        "attention": cfg.attention, "config": cfg.shape, "shape": cfg.shape_name, "params": parameter_count(cfg.shape),
        "method": {"decode": ("each step a captured CUDA graph" if graphs else "eager steps") + f", median of "
                             f"{cfg.repeats} steps; attention " + ("as two batched matmuls reading K and V once"
                                                                   if cfg.attention == "matmul" else
                                                                   "by scaled_dot_product_attention"),
                   "prefill": "batch 1, eager, queries in chunks of 2048", "dtype": cfg.dtype, "weights": "random",
                   "graphs": graphs, "skipped_cells": skipped},
        "decode": decode, "prefill": prefill, "copy_TBps": copy, "matmul_TFLOPs": rate,
        "settings": {**asdict(cfg), "prefill": [list(p) for p in cfg.prefill]},
    }
    if decode:
        fitted = fit_step_table(out)
        out["latency_model"] = {**fitted["terms"], "gpu": name}
        out["fit"] = {k: v for k, v in fitted.items() if k != "terms"}
        log(f"  fit: step {fitted['terms']['step_base_s'] * 1e3:.4g} ms + "
            f"{fitted['terms']['step_per_context_s'] * 1e6:.4g} µs per context token; every decode cell within "
            f"{fitted['decode']['max_error']:.1%}")
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in (x for x in text.split(",") if x.strip()):
        cached, _, new = item.partition(":")
        pairs.append((int(cached), int(new)))
    return pairs


def settings_from_args(argv: list[str] | None = None) -> tuple[ProbeSettings, Path]:
    p = argparse.ArgumentParser(prog="python -m sprint.latency.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="r1-distill-qwen-7b",
                   help=f"a named shape ({', '.join(SHAPES)}) or a model folder with config.json (default: %(default)s)")
    p.add_argument("--out", required=True, help="the latency file to write (JSON)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when there is one)")
    p.add_argument("--dtype", default=None, help="bfloat16 or float32 (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--attention", default="matmul", choices=("matmul", "sdpa"), help="decode attention (default: %(default)s)")
    p.add_argument("--no-graphs", action="store_true", help="time eager decode steps even under CUDA")
    p.add_argument("--batch-sizes", default=None, help="k, comma-separated (default: 1,2,3,4,6,8,12,16 on CUDA)")
    p.add_argument("--contexts", default=None, help="L, comma-separated (default: 512,2048,4096,8192,16384 on CUDA)")
    p.add_argument("--prefill", default=None, help="cached:new pairs, comma-separated (default: 11 cells on CUDA)")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per decode cell (default: 30 on CUDA, 5 on CPU)")
    p.add_argument("--time-cap", type=float, default=600.0, help="seconds after which no new cell starts (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the random weights (default: %(default)s)")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    grid = GPU_GRID if cuda else SMALL_GRID
    shape = SHAPES.get(a.shape) or shape_from_config(Path(a.shape))
    cfg = ProbeSettings(
        shape=shape, shape_name=a.shape if a.shape in SHAPES else Path(a.shape).name,
        batch_sizes=_ints(a.batch_sizes) if a.batch_sizes else list(grid["batch_sizes"]),
        contexts=_ints(a.contexts) if a.contexts else list(grid["contexts"]),
        prefill=_pairs(a.prefill) if a.prefill else list(grid["prefill"]),
        device=device, dtype=a.dtype or ("bfloat16" if cuda else "float32"), attention=a.attention,
        graphs=not a.no_graphs, repeats=a.repeats or (30 if cuda else 5), time_cap_s=a.time_cap, seed=a.seed)
    return cfg, Path(a.out)


def main(argv: list[str] | None = None) -> int:
    cfg, out = settings_from_args(argv)
    result = run_probe(cfg, log=lambda line: print(line, flush=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {out} ({len(result['decode'])} decode cells, {len(result['prefill'])} prefill cells, "
          f"{result['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
