"""Make `dlr_runtime/assets/speech_embedding.safetensors` from openWakeWord's ONNX files.

openWakeWord 0.5.1's wheel ships Google's speech_embedding (Apache-2.0) and its mel front
end as ONNX graphs (`resources/models/embedding_model.onnx`, `melspectrogram.onnx`). This
reads their weights into the flat tensor names `dlr_runtime/speech_embedding.py` loads, checks
the layer layout it expects, and writes the asset once; the asset is committed, so neither the
product nor its tests need openWakeWord.

    pip install --no-deps openwakeword==0.5.1
    python -m training.data.speech_embedding_asset [--out dlr_runtime/assets/speech_embedding.safetensors]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from safetensors.torch import save_file

from dlr_runtime.speech_embedding import ASSET, LAYOUT


def onnx_dir() -> Path:
    """openWakeWord's ONNX folder (it need not import: only its files are read)."""
    spec = importlib.util.find_spec("openwakeword")
    if spec is None or spec.origin is None:
        raise SystemExit("needs `pip install --no-deps openwakeword==0.5.1` (its ONNX files)")
    return Path(spec.origin).parent / "resources" / "models"


def embedding_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The convolutions' weights and biases, named c0 .. c19, after checking the layout."""
    graph = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    kinds, out = [], {}
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            k = f"c{sum(1 for x in kinds if x.startswith('c'))}"
            kinds.append(k)
            w = inits[node.input[1]].astype(np.float32)
            b = inits[node.input[2]] if len(node.input) > 2 else np.zeros(w.shape[0], np.float32)
            out[f"{k}.weight"] = torch.from_numpy(w.copy())
            out[f"{k}.bias"] = torch.from_numpy(b.astype(np.float32).copy())  # c19 has none: 0
        elif node.op_type == "MaxPool":
            kinds.append("t" if list(attrs["kernel_shape"]) == [2, 2] else "f")
        elif node.op_type == "LeakyRelu" and abs(attrs["alpha"] - 0.2) > 1e-6:
            raise ValueError(f"unexpected LeakyRelu slope {attrs['alpha']}")
    if tuple(kinds) != tuple(LAYOUT):
        raise ValueError(f"unexpected layer layout {kinds}")
    return out


def mel_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The mel stage's DFT (as two convolutions) and filterbank."""
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    return {
        "stft_re": torch.from_numpy(inits["0.stft.conv_real.weight"].copy()),
        "stft_im": torch.from_numpy(inits["0.stft.conv_imag.weight"].copy()),
        "mel": torch.from_numpy(inits["1.melW"].copy()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ASSET))
    a = ap.parse_args()
    d = onnx_dir()
    tensors = mel_tensors(d / "melspectrogram.onnx") | embedding_tensors(d / "embedding_model.onnx")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, a.out, metadata={"source": "openwakeword==0.5.1 resources/models"})
    print(f"wrote {a.out}: {sum(t.numel() for t in tensors.values()):,} numbers")


if __name__ == "__main__":
    main()
