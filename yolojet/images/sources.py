"""Where images come from: files, globs and directories expanded to image files, and files read into memory."""

from __future__ import annotations

import glob
from pathlib import Path

from yolojet.errors import ImageReadError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def read_image_file(source: str | Path) -> bytes:
    """A file's bytes; an ImageReadError naming it where it is missing, a directory or unreadable."""
    path = Path(source)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pattern = any(ch in str(source) for ch in "*?[")  # a glob expand_sources found nothing for
        raise ImageReadError(f"{path}: {'no image file matches it' if pattern else 'no such file'}") from None
    except IsADirectoryError:
        raise ImageReadError(f"{path}: is a directory, not an image file") from None
    except OSError as e:
        raise ImageReadError(f"{path}: cannot read it ({e.strerror})") from None


def expand_sources(sources: list[str]) -> list[str]:
    """Files, globs and directories → the image files they name, in a stable order; a name matching nothing is kept
    as is so that loading it reports it."""
    files: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            # Anything named like an image but a folder: a broken link or an unreadable file is kept so that
            # reading it reports it; a folder called 2024.jpg is searched like any other.
            files += sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
        elif any(ch in source for ch in "*?["):
            matches = sorted(glob.glob(source, recursive=True))
            named = [m for m in matches if Path(m).suffix.lower() in IMAGE_SUFFIXES and not Path(m).is_dir()]
            files += named or [source]
        else:
            files.append(source)
    return files
