"""`yolojet label` and `yolojet plot`: mass labeling into JSON lines, COCO and YOLO label files, against a server or
on a local engine, resumable with each image exactly once; and pictures of what was labeled.

- `records.py`: the JSON line of one image, made alike from a server's reply and from local results; reading an
  output back (resume);
- `sources.py`: what to label (files, globs, directories, text files of paths);
- `remote.py`: a server over InferBatchStream with images in flight, several a message, retried; the bench mode;
- `local.py`: the engine in this process;
- `formats.py`: COCO annotations and YOLO label files (with a dataset YAML) from records;
- `label.py`: the command: outputs, resume, the error log, progress, the summary;
- `plot.py`: a grid of annotated images and histograms of classes and scores.
"""
