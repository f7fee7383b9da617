"""What `yolojet label` labels: image files, globs and directories (searched recursively), and text files listing
one image path or http(s) URL a line (relative paths relative to the list's folder)."""

from __future__ import annotations

from pathlib import Path

from yolojet.errors import ImageReadError
from yolojet.images import expand_sources
from yolojet.images.sources import URL_SCHEMES

LIST_SUFFIXES = {".txt", ".lst"}


def label_sources(sources: list[str]) -> list[str]:
    """Every image path the sources name, in a stable order; a name matching nothing is kept so that labeling it
    reports it in the error log."""
    files: list[str] = []
    for source in sources:
        path = Path(source)
        if path.suffix.lower() in LIST_SUFFIXES and path.is_file():
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as e:
                raise ImageReadError(f"{source}: cannot read it as a list of image paths ({e})") from e
            for line in lines:
                entry = line.strip()
                if entry and not entry.startswith("#"):
                    listed = Path(entry)
                    if entry.lower().startswith(URL_SCHEMES) or listed.is_absolute():
                        files += expand_sources([entry])
                    else:
                        files += expand_sources([str(path.parent / listed)])
        else:
            files += expand_sources([source])
    return files
