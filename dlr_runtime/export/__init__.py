"""Export of recurrent DLR models to other runtimes: ONNX graphs and Triton model repositories.

- `realmath`: real-arithmetic twin of the recurrent step/chunk (what gets exported).
- `onnx_export`: `export_onnx(rec, out_dir)` writes step/chunk/scores graphs + manifest.
- `triton`: `export_triton(rec, out_dir)` writes a Triton Inference Server model repository.
- `cli`: the `dlr-export` command.
"""
