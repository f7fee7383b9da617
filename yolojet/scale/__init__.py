"""Beyond one engine: every GPU of a host and many hosts.

- `devices`: what `--devices` names (all, GPU indices, device names).
- `server_workers`: `yolojet serve --devices`, one engine worker process a device behind one gRPC front end.
- `local_workers`: `yolojet label --local --devices`, one labeling worker process a device in one command.
- `ray_label`: `yolojet label --ray`, Ray Data over a cluster.
- `ray_serve`: `yolojet serve --ray`, the service as a Ray Serve deployment behind Ray's gRPC proxy.
- `ray_cluster`: joining a Ray cluster (or starting one here) for both.

ray is imported inside the Ray modules' functions only, when those paths run.
"""
