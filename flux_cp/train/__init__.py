"""The training step and its harnesses: FluxStep (one step under a strategy), the step graph, the compile cache,
the LightningModule and Lightning strategies, and the bare PyTorch loop that is every configuration's twin."""
