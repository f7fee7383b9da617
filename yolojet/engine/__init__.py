"""The GPU engine: memory plan, lowering, tuning, compile workers, streams, the network on our kernels, the captured
predict path, the image feed and the public `Engine` (imported from `yolojet.engine.engine`)."""
