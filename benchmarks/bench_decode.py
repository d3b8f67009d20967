"""Text decoding: DLR (torch eager, fused, torch.compile, ONNX Runtime) vs a KV-cache Transformer.

Both models have about the same parameter count (printed). At each context length (256, 2K,
8K, 32K) and batch (1, 16, 64) the DLR's state is a random state of its fixed size (what any
context leaves behind) and the Transformer's KV cache is prefilled with random keys/values up
to the context, so reaching a context costs nothing; then decoding steps are timed (median of
the steps that fit a small time budget per point; a few to a few hundred tokens).

Reported per point: tokens/s per session and aggregate, the ratio DLR / Transformer (same run),
and memory per session: DLR state bytes vs KV-cache bytes. Points whose KV cache would exceed
--kv-budget-gb are skipped (marked "-").

    nice -n 10 .venv/bin/python -m benchmarks.bench_decode [--quick] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import math
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.harness import PLOTS, append_results, machine, md_table, time_calls
from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends.fused import FusedBackend, fused_supported
from dlr_runtime.backends.onnx import OnnxBackend
from dlr_runtime.backends.torch_compiled import FastTorchBackend

VOCAB = 258


class KVTransformer(nn.Module):
    """A pre-norm causal decoder (GELU MLP 4x) that decodes one token with a KV cache."""

    def __init__(self, d: int, layers: int, heads: int, vocab: int = VOCAB) -> None:
        super().__init__()
        self.d, self.h, self.hd = d, heads, d // heads
        self.embed = nn.Embedding(vocab, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(layers)
        )
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def new_cache(self, batch: int, max_len: int, filled: int) -> dict:
        """KV cache (L, B, heads, max_len, hd) x 2 holding `filled` random positions."""
        shape = (len(self.qkv), batch, self.h, max_len, self.hd)
        k, v = torch.empty(shape), torch.empty(shape)
        k[..., :filled, :].normal_()
        v[..., :filled, :].normal_()
        return {"k": k, "v": v, "pos": filled}

    def kv_bytes_per_session(self, context: int) -> int:
        return 2 * len(self.qkv) * context * self.d * 4

    @torch.no_grad()
    def step(self, tok: torch.Tensor, cache: dict) -> torch.Tensor:
        """tok (B,) -> logits (B, V); appends this position's keys/values to the cache."""
        b, p = tok.shape[0], cache["pos"]
        x = self.embed(tok)  # (B, d)
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.ln1[i](x)).view(b, 3, self.h, 1, self.hd).unbind(1)
            cache["k"][i, :, :, p : p + 1] = k  # (B, h, 1, hd)
            cache["v"][i, :, :, p : p + 1] = v
            a = F.scaled_dot_product_attention(
                q, cache["k"][i, :, :, : p + 1], cache["v"][i, :, :, : p + 1]
            )  # (B, h, 1, hd): the new position attends to the whole context
            x = x + self.proj[i](a.reshape(b, self.d))
            x = x + self.mlp[i](self.ln2[i](x))
        cache["pos"] = p + 1
        return self.head(self.lnf(x))


def build(quick: bool):
    dlr_cfg = DLRConfig.preset("decode-lm")
    dlr = to_recurrent(DLRModel(dlr_cfg, seed=0))
    n_dlr = DLRModel(dlr_cfg, seed=0).num_parameters()
    tf = KVTransformer(d=128, layers=4, heads=4).eval()
    n_tf = sum(p.numel() for p in tf.parameters())
    return dlr, n_dlr, tf, n_tf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="contexts 256/2K, batch 1/16, short budget"
    )
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of decoding per point")
    ap.add_argument("--kv-budget-gb", type=float, default=3.0)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--threads", type=int, default=1, help="torch and ORT threads (default 1)")
    ap.add_argument("--results", default=None, help="append a section to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    contexts = [256, 2048] if args.quick else [256, 2048, 8192, 32768]
    batches = [1, 16] if args.quick else [1, 16, 64]
    budget = 0.2 if args.quick else args.budget
    dlr, n_dlr, tf, n_tf = build(args.quick)
    print(f"{machine()}\nDLR params {n_dlr:,}, Transformer params {n_tf:,}")

    fast = FastTorchBackend(dlr, compile_cpu=False)
    fused = FusedBackend(dlr) if fused_supported(dlr) is None else None
    compiled = None
    if not args.no_compile:
        compiled = torch.compile(fast.stepper, dynamic=True)  # one graph for every batch size
    onnx_be = OnnxBackend.from_recurrent(
        dlr, tempfile.mkdtemp(prefix="bench-onnx-"), max_chunk=8, threads=args.threads
    )

    rows, series = [], {}
    for b in batches:
        tok = torch.randint(0, VOCAB, (b,))
        st = dlr.init_state(b)
        # the state a context leaves behind has the same shape at every context: a random one
        # (timed again at each context, to show the cost does not grow)
        st["ssm"] = torch.randn_like(st["ssm"]) * 0.1
        ost = onnx_be.from_torch_state(st)
        ssm_r = torch.view_as_real(st["ssm"])
        fst = fused.from_canonical(st) if fused is not None else None
        for ctx in contexts:
            dlr_t = {
                "eager": time_calls(lambda t=tok, s=st: dlr.step(t, s), budget)[0],
                "onnx": time_calls(lambda t=tok, s=ost: onnx_be.step(t, s), budget)[0],
            }
            if fused is not None:
                dlr_t["fused"] = time_calls(lambda t=tok, s=fst: fused.step(t, s), budget)[0]
            if compiled is not None:
                with torch.no_grad():
                    dlr_t["compiled"] = time_calls(lambda t=tok, s=ssm_r: compiled(t, s), budget)[0]
            kv = tf.kv_bytes_per_session(ctx)
            if kv * b > args.kv_budget_gb * 2**30:
                tf_s = float("nan")
            else:
                cache = tf.new_cache(b, ctx + 1000, ctx)

                def tf_step(cache=cache, tok=tok, ctx=ctx):
                    tf.step(tok, cache)
                    cache["pos"] = ctx  # stay at this context length

                tf_s = time_calls(tf_step, budget, max_calls=200)[0]
                del cache
            best = min(dlr_t.values())
            row = [ctx, b]
            for k in ("eager", "fused", "compiled", "onnx"):
                row.append(b / dlr_t[k] if k in dlr_t else float("nan"))
            row += [b / tf_s, (1 / best) / (1 / tf_s), dlr.state_bytes_per_session(), kv]
            rows.append(row)
            for k, v in dlr_t.items():
                series.setdefault((f"DLR {k}", b), []).append((ctx, b / v))
            series.setdefault(("Transformer+KV", b), []).append((ctx, b / tf_s))
            print(
                f"ctx {ctx:6d} batch {b:3d}: " + ", ".join(f"{x:.3g}" for x in row[2:8]), flush=True
            )

    headers = [
        "context", "batch", "DLR eager tok/s", "DLR fused tok/s", "DLR compiled tok/s",
        "DLR onnx tok/s",
        "Transformer tok/s", "best DLR / Transformer", "DLR state B/session", "KV cache B/session",
    ]  # fmt: skip
    table = md_table(headers, rows)
    print(table)
    png = PLOTS / "decode.png"
    plot(series, batches, png)
    note = (
        f"DLR: H=256, N=64, 4 layers ({n_dlr:,} params); Transformer: d=128, 4 layers, 4 heads, "
        f"MLP 4x ({n_tf:,} params). tok/s = aggregate over the batch (per session = tok/s / "
        f"batch). DLR 'fused' = the numba decode step (backends.fused); 'compiled' = torch.compile(dynamic=True) of the real-arithmetic step. "
        f"'-' = KV cache over {args.kv_budget_gb} GB, not run. Plot: benchmarks/plots/decode.png"
    )
    append_results(
        args.results, "Text decoding: DLR vs KV-cache Transformer", note + "\n\n" + table
    )


def plot(series: dict, batches: list[int], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        for (name, bb), pts in sorted(series.items()):
            if bb == b:
                xs = [p[0] for p in pts if not math.isnan(p[1])]
                ax.plot(xs, [p[1] for p in pts if not math.isnan(p[1])], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", title=f"batch {b}")
        ax.set_ylabel("tokens/s (aggregate)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
