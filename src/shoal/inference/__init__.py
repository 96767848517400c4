"""A trained model put to use: predictions over a dataset or rows in memory (`shoal predict`,
`shoal.predict`) and export to TorchScript, ONNX or safetensors (`shoal export`), each with its checks.

None of it trains, so none of it is training's: it starts from a run directory's model.pt
(`shoal.run.artifacts`) and the loss's reading of outputs (`shoal.train.objective`), and runs with no
job: no store, no ranks, no algorithm.
"""
