"""A small demonstration of the runtime: one model in convolution, chunk and step form."""

from __future__ import annotations

import time

import torch

from . import DLRConfig, DLRModel, reference_forward, to_recurrent


def main() -> None:
    cfg = DLRConfig(d_model=64, d_state=64, n_layers=2, vocab_size=258)
    model = DLRModel(cfg, seed=0).double().eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 512), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        conv = model(tokens)
    ref = reference_forward(model, tokens)
    rec = to_recurrent(model, dtype=torch.complex128)
    state = rec.init_state(2)
    chunks = []
    for piece in tokens.split(100, dim=1):
        y, state = rec.chunk(piece, state)
        chunks.append(y)
    chunk = torch.cat(chunks, dim=1)
    t0 = time.perf_counter()
    state = rec.init_state(2)
    steps = []
    for t in range(tokens.shape[1]):
        y, state = rec.step(tokens[:, t], state)
        steps.append(y)
    dt = time.perf_counter() - t0
    step = torch.stack(steps, dim=1)
    scale = ref.abs().max().item()
    print(f"model: {model.num_parameters():,} parameters, state {rec.state_bytes_per_session():,} bytes/session")
    for name, out in (("fft conv", conv), ("chunk", chunk), ("step", step)):
        print(f"{name:>8}: max |out - reference| / max |reference| = {(out - ref).abs().max().item() / scale:.2e}")
    print(f"step loop: {tokens.numel() / dt:,.0f} tokens/s (batch 2, float64)")


if __name__ == "__main__":
    main()
