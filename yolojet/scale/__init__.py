"""Beyond one engine: every GPU of a host and many hosts.

- `server_workers`: `yolojet serve --devices`, one engine worker process a device behind one gRPC front end.
- `local_workers`: `yolojet label --local --devices`, one labeling worker process a device in one command.
- `ray_label`: `yolojet label --ray`, Ray Data over a cluster (ray is imported there only, when used).
"""
