"""COCO evaluation: datasets (COCO JSON or ultralytics YAML), the pycocotools protocol, and `validate`."""
