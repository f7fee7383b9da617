"""Decoders: encoded images (files or bytes) → `Frame`s, a batch at a time.

- `cpu`: a pool of threads, one a core, each reading a file and decoding it with OpenCV's `imdecode` (which releases
  the GIL) or Pillow; for a GPU engine the pixels then go to the device from the decoded array on a copy stream. The
  pixels are OpenCV's, and so ultralytics'.

Each decoder works in two steps, so that a stream's images are read and handed on as they come and the GPU decodes
them a batch at a time: `prepare(item)` (on the feed's source thread: the CPU pool starts at once; the GPU decoders
read the file and check its header) and `finish(pending)` (a batch: the GPU decode, then waiting for the pool).
- `nvimgcodec`: JPEGs in one batched call to the GPU's hardware JPEG decoders (nvImageCodec, A100 / H100 / H200
  class GPUs), which leave the SMs to the network; their pixels are within one level of OpenCV's. What they refuse
  (progressive, CMYK, arithmetic-coded or lossless JPEGs) and other formats go to the CPU pool. Local JPEG files are
  read by nvImageCodec itself (`jpeg_file_stream`), and a batch may be decoded into an earlier batch's output
  images once its frames are consumed (`finish(pending, pool)`, an `OutputPool`): each saves the GIL round trips of
  a Python file read and of allocating an output an image. On an H200 over 10,000 files the engine's stream ran
  6,239-7,660 img/s with them against 5,100-6,948 without, two runs whose spread is as large as the gain
  (bench/NOTES.md).
- `nvjpeg`: torchvision's nvJPEG on the SMs, batched; only when asked for by name, since its pixels differ from
  OpenCV's by up to tens of levels on some photos.
- `hardware`: the same hardware decoders through nvJPEG's C API (`NvjpegHardwareDecoder`): a file wholly in the page
  cache read holding the GIL, nvJPEG's header check holding it, a batch's decode one call that lets go of it once.
  It starts in 0.1 s where nvImageCodec takes 2.1 s holding the GIL, its call of 64 took 80-94 us an image against
  98-121 (H200), and the engine's stream over 10,000 files ran as fast as through nvImageCodec (bench/NOTES.md).
- `auto` (the default): `hardware` where the GPU has hardware decoders and nvJPEG is installed, else `cpu`.

Every decoder checks the bytes first (`codecs.check_encoded`): empty, unknown, cut-short JPEGs and images over the
pixel limit are errors naming the input, whichever decoder would have run. Errors are per image: a batch's other
images are still decoded. EXIF orientation is applied on every path, as cv2.imread applies it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import io
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from yolojet.errors import EngineConfigError, ImageReadError
from yolojet.images.codecs import DEFAULT_MAX_PIXELS, JPEG_EOI, EncodedInfo, check_encoded, decode_cpu
from yolojet.images.frames import Frame, describe
from yolojet.images.sources import is_url, keep_freed_memory, read_cached_file, read_image_file, refused_source
from yolojet.options import DECODER_NAMES, cache_dir, name_nvimgcodec_extensions, nvimgcodec_extensions_given

_MAX_THREADS = 32  # more threads than this gain nothing on one process's file reads and decodes


def cpu_threads() -> int:
    """The cores this process may run on, at most 32."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


@dataclass
class Encoded:
    """An encoded image to decode: a file to read, or bytes in memory."""

    source: str | Path | bytes
    name: str
    path: str = ""

    @classmethod
    def of(cls, source: str | Path | bytes | bytearray | memoryview) -> Encoded:
        if isinstance(source, (str, Path)):
            return cls(source, str(source), str(source))
        return cls(bytes(source), describe(source))

    def read(self) -> bytes:
        return read_image_file(self.source) if isinstance(self.source, (str, Path)) else self.source


@dataclass
class DecodedBatch:
    """A batch's frames, or each one's error, in order; frames on a GPU may be used on a stream once it has waited
    for `ready`."""

    items: list[Frame | ImageReadError]
    ready: list[torch.cuda.Event] = field(default_factory=list)
    # The decoder's own output buffers behind these frames (the hardware decoders' images): once nothing reads the
    # frames any more, they go to an `OutputPool`, from which later batches decode into them rather than allocate.
    outputs: list[Any] = field(default_factory=list)

    def wait_on(self, stream: torch.cuda.Stream) -> None:
        for event in self.ready:
            stream.wait_event(event)


class OutputPool:
    """Output buffers of batches whose frames nothing reads any more (`give`), which later batches decode into
    (`finish(pending, pool)`). A decoder takes only what it decodes into and leaves the rest for the next batch: a
    batch that carried every spare buffer until it was released left the batch decoded after it none, so each time
    two batches were decoded with no release between them a buffer was made, and the pool grew without bound (four
    server processes ran an 80 GB GPU out of memory after ~120,000 requests, 168 MB a buffer of 64 photos). Now the
    hardware decoder's buffers are at most the batches holding one at once (nvImageCodec's images: those held, plus up
    to a batch's worth). Batches are released on one thread while another decodes, so it locks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: list[Any] = []

    def __len__(self) -> int:
        return len(self._spare)

    def give(self, outputs: Iterable[Any]) -> None:
        with self._lock:
            self._spare.extend(outputs)

    def take_buffer(self, size: int) -> torch.Tensor | None:
        """The smallest spare tensor of at least `size` elements, taken out. None where none is that large; the
        largest spare tensor is then dropped, since a new buffer takes its place (a pool of buffers grown too small
        would otherwise be kept beside the new ones)."""
        with self._lock:
            tensors = [(b.numel(), i) for i, b in enumerate(self._spare) if isinstance(b, torch.Tensor)]
            fitting = [(n, i) for n, i in tensors if n >= size]
            if fitting:
                return self._spare.pop(min(fitting)[1])
            if tensors:
                del self._spare[max(tensors)[1]]
            return None

    def take_images(self, count: int) -> list[Any]:
        """`count` spare images (nvImageCodec's, not tensors) taken out, or none where there are fewer."""
        with self._lock:
            at = [i for i, b in enumerate(self._spare) if not isinstance(b, torch.Tensor)][:count]
            if len(at) < count:
                return []
            taken = [self._spare[i] for i in at]
            for i in reversed(at):
                del self._spare[i]
            return taken


@dataclass
class Pending:
    """An image on its way to a frame: known already (`outcome`, a frame or an error), being decoded on the CPU pool
    (`future`), or read and checked, waiting for its batch's GPU decode (`data`, with the orientation a decoder that
    does not apply EXIF must apply itself and the stored size; or `code_stream`, a file nvImageCodec has read
    itself)."""

    item: Encoded
    outcome: Frame | ImageReadError | None = None
    future: Future | None = None
    data: bytes | None = None
    orientation: int = 1
    size: tuple[int, int] = (0, 0)  # (height, width) as stored, from the header, for a decoder sizing its outputs
    code_stream: Any = None

    @property
    def for_the_gpu(self) -> bool:
        return self.outcome is None and self.future is None and (self.data is not None or self.code_stream is not None)

    def result(self) -> Frame | ImageReadError:
        if self.outcome is None and self.future is not None:
            self.outcome = self.future.result()
        assert self.outcome is not None
        return self.outcome


class CpuDecoder:
    """Files read and decoded on a pool of threads; frames moved to `device` when it is a GPU.

    `prepare` hands an image to the pool at once (so decoding runs ahead, across batches), `finish` waits for a
    batch of them; `decode` is both."""

    name = "cpu"

    def __init__(self, device: torch.device, max_pixels: int = DEFAULT_MAX_PIXELS, threads: int | None = None):
        keep_freed_memory()  # every decoder reads files or takes received bytes, and makes frames, through this one
        self.device = device
        self.max_pixels = max_pixels
        self.threads = threads or cpu_threads()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="yolojet-decode")
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @property
    def cpu(self) -> CpuDecoder:
        """The CPU pool (every decoder has one, for what the GPU does not decode): itself."""
        return self

    def describe(self) -> str:
        return f"cpu (OpenCV's libjpeg-turbo / libpng / libwebp on {self.threads} threads)"

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def decode_bytes(self, data: bytes, item: Encoded, checked: bool = False) -> Frame:
        """One image's bytes → a frame on the decoder's device (run on a pool thread, or on the caller's); `checked`:
        its header has passed `check_encoded` already."""
        if not checked:
            check_encoded(data, item.name, self.max_pixels)
        return Frame(self.to_device(decode_cpu(data, item.name)), bgr=True, path=item.path, encoded=data)

    def decode_one(self, item: Encoded) -> Frame:
        return self.decode_bytes(item.read(), item)

    def to_device(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.copy_stream is None:
            return pixels
        # Straight from the decoded (pageable) array on the copy stream: CUDA returns once the pixels are staged, so
        # the array may go, and the batch's `ready` event covers the rest of the copy. One torch call, where a copy
        # through a pinned buffer of torch's was three (each letting go of the GIL and waiting to take it back beside
        # the pool's other threads): 64 1080x810 JPEGs decoded and moved on an H200's 16 cores at 2,284 img/s against
        # 1,735 (decoding alone 2,535; bench/NOTES.md).
        with torch.cuda.stream(self.copy_stream):
            return pixels.to(self.device, non_blocking=True)

    def submit(self, item: Encoded, data: bytes | None = None, checked: bool = False) -> Pending:
        """The image decoded on the pool: from its bytes where they are read already, else read there too."""
        if data is None:
            return Pending(item, future=self.pool.submit(_outcome, self.decode_one, item))
        return Pending(item, future=self.pool.submit(_outcome, self.decode_bytes, data, item, checked))

    def prepare(self, item: Encoded) -> Pending:
        return self.submit(item)

    def ready_events(self) -> list[torch.cuda.Event]:
        """An event after every copy queued so far (call once all of a batch's decodes have returned)."""
        if self.copy_stream is None:
            return []
        event = torch.cuda.Event()
        event.record(self.copy_stream)
        return [event]

    def finish(
        self, pending: list[Pending], pool: OutputPool | None = None, entering: threading.Event | None = None
    ) -> DecodedBatch:
        """The batch's frames (its arrays own their memory: nothing is taken from `pool`); `entering` is for
        decoders with one long call (`blocking_finish`), which this is not."""
        outcomes = [p.result() for p in pending]
        return DecodedBatch(outcomes, self.ready_events())

    def decode(self, items: list[Encoded], pool: OutputPool | None = None) -> DecodedBatch:
        return self.finish([self.prepare(item) for item in items], pool)


def _outcome(fn, *args):
    try:
        return fn(*args)
    except ImageReadError as e:
        return e


_PROBE_RGB = (90, 140, 200)


@functools.cache
def _probe_jpeg() -> bytes:
    """A small baseline JPEG, to ask a hardware decoder whether it decodes at all."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), _PROBE_RGB).save(out, format="JPEG", quality=90)
    return out.getvalue()


# How much of a file's end `jpeg_file_stream` reads for the end-of-image marker: a whole JPEG ends with it, at most
# after a little padding; one with more after it (a phone's trailer) takes the ordinary path, which searches the file.
_JPEG_TAIL = 64


def jpeg_file_stream(nv: Any, path: str, max_pixels: int) -> Any | None:
    """nvImageCodec's code stream of a local JPEG file the hardware decoders take (1 or 3 components, within
    `max_pixels`, ending with an end-of-image marker, so not cut short), made by its C++ from the path: the file is
    read with the GIL let go once, where Python's read lets go of it several times and each time back may wait for
    another thread. None for anything else (another format, a URL, a missing or odd file, a JPEG needing a closer
    look): the ordinary path reads and checks it, and names what is wrong."""
    if is_url(path) or refused_source(path) is not None:
        return None
    try:
        stream = nv.CodeStream(path)
        jpeg, channels, pixels = stream.codec_name == "jpeg", stream.num_channels, stream.width * stream.height
    except RuntimeError:  # missing, a directory, empty, not an image: read_image_file and check_encoded say which
        return None
    if not jpeg or channels not in (1, 3) or not 0 < pixels <= max_pixels:
        return None
    try:
        handle = os.open(path, os.O_RDONLY)
        try:
            tail = os.pread(handle, _JPEG_TAIL, max(0, stream.size - _JPEG_TAIL))
        finally:
            os.close(handle)
    except OSError:
        return None
    return stream if JPEG_EOI in tail else None


class _GpuJpegDecoder:
    """What the two GPU decoders share: `prepare` (on the feed's source thread) reads an image and checks its header;
    JPEGs the GPU takes wait for their batch, the rest go to the CPU pool at once; `finish` decodes a batch's JPEGs
    in one call on the decoder's stream and sends its refusals to the CPU pool."""

    name = ""

    def __init__(self, cpu: CpuDecoder) -> None:
        self.cpu, self.device = cpu, cpu.device
        self.stream = torch.cuda.Stream(self.device)

    def close(self) -> None:
        self.cpu.close()

    def _takes(self, info: EncodedInfo) -> bool:
        """Whether this JPEG goes to the GPU decoder."""
        return info.jpeg is not None

    def _decode_jpegs(
        self, jpegs: list[Pending], pool: OutputPool | None, entering: threading.Event | None = None
    ) -> tuple[list[torch.Tensor | None], list[Any]]:
        """Each JPEG's (H, W, C) RGB pixels on the device, None where the GPU refused it; and the output buffers
        behind them, to give to a pool once the frames are consumed (those taken from `pool` among them). `jpegs`:
        `prepare`'s, each with its bytes or its code stream; `entering`: `finish`'s."""
        raise NotImplementedError

    def prepare(self, item: Encoded, data: bytes | None = None) -> Pending:
        """`data`: the item's bytes where the caller has read them already."""
        try:
            data = item.read() if data is None else data
            info = check_encoded(data, item.name, self.cpu.max_pixels)
        except ImageReadError as e:
            return Pending(item, outcome=e)
        if not self._takes(info):
            return self.cpu.submit(item, data, checked=True)
        orientation = info.jpeg.orientation if info.jpeg else 1
        return Pending(item, data=data, orientation=orientation, size=(info.height, info.width))

    def finish(
        self, pending: list[Pending], pool: OutputPool | None = None, entering: threading.Event | None = None
    ) -> DecodedBatch:
        """The batch's frames: its JPEGs in one GPU call, decoded into buffers from `pool` (earlier batches'
        `outputs`, whose frames nothing reads any more) where it has them. `entering` (a `blocking_finish` decoder's) is
        set just before the call that lets go of the GIL, so that a thread waiting on it takes the GIL once this
        thread is inside that call rather than at a point where it would soon want the GIL back."""
        gpu = [p for p in pending if p.for_the_gpu]
        outputs: list[Any] = []
        if gpu:
            decoded, outputs = self._decode_jpegs(gpu, pool, entering)
            for p, pixels in zip(gpu, decoded, strict=True):
                if pixels is None:  # refused by the GPU decoder: the CPU pool instead (reading the file if not read)
                    p.future = self.cpu.submit(p.item, p.data, checked=p.data is not None).future
                else:
                    at_path = p.code_stream is not None
                    p.outcome = Frame(pixels, bgr=False, path=p.item.path, encoded=p.data, encoded_at_path=at_path)
        if entering is not None:  # what is left is waiting for the CPU pool, the GIL let go (all of it, without JPEGs)
            entering.set()
        outcomes = [p.result() for p in pending]
        ready = self.cpu.ready_events()
        if gpu:
            event = torch.cuda.Event()
            event.record(self.stream)
            ready.append(event)
        return DecodedBatch(outcomes, ready, outputs)

    def decode(self, items: list[Encoded], pool: OutputPool | None = None) -> DecodedBatch:
        return self.finish([self.prepare(item) for item in items], pool)


# Where the nvJPEG wheels put their library, relative to nvImageCodec's extensions (the extension's own RUNPATH).
_NVJPEG_BESIDE_EXTENSIONS = ("../../cu13/lib", "../../nvjpeg/lib")


def _load_only_the_jpeg_extension() -> None:
    """Point nvImageCodec at a folder holding its nvJPEG extension alone, unless the user named one.

    Its import loads every extension module its package ships (eight: JPEG 2000, TIFF, OpenCV's, ...) and creates
    their codecs, all while holding the GIL, and those whose CUDA library is not installed print install hints on
    stderr at every start. The hardware JPEG decoder is in the nvJPEG extension; the CPU pool decodes everything else.
    The folder (a link to the package's file) lives in yolojet's cache, one for each installed copy of the package
    (named by its path, so that two environments sharing the cache never swap each other's link), and is made
    atomically so that processes starting side by side agree on it."""
    from importlib.util import find_spec

    if nvimgcodec_extensions_given():
        return
    spec = find_spec("nvidia.nvimgcodec")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import below says so
    shipped = sorted((Path(spec.submodule_search_locations[0]) / "extensions").glob("libnvjpeg_ext.so*"))
    if not shipped:
        return  # a layout this code does not know: nvImageCodec's own default
    installed = hashlib.sha1(str(shipped[-1].resolve()).encode()).hexdigest()[:16]
    folder = cache_dir() / "nvimgcodec-extensions" / installed
    link = folder / shipped[-1].name
    try:
        if not link.exists() or link.resolve() != shipped[-1].resolve():
            folder.mkdir(parents=True, exist_ok=True)
            temporary = folder / f".{shipped[-1].name}.{os.getpid()}"
            temporary.unlink(missing_ok=True)
            temporary.symlink_to(shipped[-1])
            os.replace(temporary, link)
    except OSError:
        return  # a read-only cache: every extension, as nvImageCodec loads them by default
    # The extension finds nvJPEG's library through a path relative to its own folder ($ORIGIN in its RUNPATH), which
    # the link's folder is not: load it here first, so that the extension's dlopen finds it loaded by its name.
    real = shipped[-1].resolve().parent
    libraries = [lib for where in _NVJPEG_BESIDE_EXTENSIONS for lib in sorted((real / where).glob("libnvjpeg.so.*"))]
    if not libraries:
        return  # where the extension would find it some other way (a CUDA toolkit): nvImageCodec's own default
    try:
        ctypes.CDLL(str(libraries[-1]), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return
    name_nvimgcodec_extensions(folder)


class HardwareJpegDecoder(_GpuJpegDecoder):
    """JPEGs on the GPU's hardware JPEG decoders through nvImageCodec, one batched call a batch; the rest on the CPU
    pool (`cpu`)."""

    name = "nvimgcodec"

    def __init__(self, cpu: CpuDecoder) -> None:
        # nvImageCodec logs a warning for every image it refuses (which the CPU pool then decodes) unless told
        # otherwise; a user's own setting wins.
        os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        _load_only_the_jpeg_extension()
        try:
            from nvidia import nvimgcodec
        except ImportError as e:
            raise EngineConfigError(
                "decoder 'nvimgcodec': nvImageCodec is not installed (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg)"
            ) from e
        super().__init__(cpu)
        self._nv = nvimgcodec
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            self._decoder = nvimgcodec.Decoder(
                device_id=index, backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)]
            )
            # Interleaved RGB, turned upright by EXIF orientation, 8 bits (cv2.imread's IMREAD_COLOR, in RGB order).
            self._params = nvimgcodec.DecodeParams(apply_exif_orientation=True, color_spec=nvimgcodec.ColorSpec.SRGB)
            probe = Pending(Encoded(_probe_jpeg(), "probe"), data=_probe_jpeg())
            decodes = self._decode_jpegs([probe], None)[0][0] is not None
        except Exception as e:  # a driver too old for this build, a library that fails to load: no hardware path
            raise EngineConfigError(f"decoder 'nvimgcodec': nvImageCodec could not start here ({e})") from e
        if not decodes:
            raise EngineConfigError(
                f"decoder 'nvimgcodec': {torch.cuda.get_device_name(self.device)} has no hardware JPEG decoder "
                "nvImageCodec can use; use decoder='cpu'"
            )

    def describe(self) -> str:
        return f"nvimgcodec (hardware JPEG decoders; other images on {self.cpu.describe()})"

    def _takes(self, info: EncodedInfo) -> bool:
        """Baseline JPEGs of 1 or 3 components: what the hardware decoders take (others go straight to the CPU rather
        than through a refusal)."""
        return info.jpeg is not None and not info.jpeg.progressive and info.jpeg.components in (1, 3)

    def prepare(self, item: Encoded, data: bytes | None = None) -> Pending:
        """A local JPEG file the hardware decoders take is read by nvImageCodec itself, during the decode call; any
        other image is read and checked here, as the other decoders do."""
        if data is None and isinstance(item.source, (str, Path)):
            stream = jpeg_file_stream(self._nv, str(item.source), self.cpu.max_pixels)
            if stream is not None:
                return Pending(item, code_stream=stream)
        return super().prepare(item, data)

    def _decode_jpegs(
        self, jpegs: list[Pending], pool: OutputPool | None, entering: threading.Event | None = None
    ) -> tuple[list[torch.Tensor | None], list[Any]]:
        # nvImageCodec applies EXIF orientation itself (its params).
        streams = [p.code_stream if p.code_stream is not None else self._nv.CodeStream(p.data) for p in jpegs]
        into = pool.take_images(len(streams)) if pool is not None else []
        if into:  # its own images, of frames consumed: resized in place where they must grow
            images = self._decoder.decode(
                streams, images=into, params=self._params, cuda_stream=self.stream.cuda_stream
            )
        else:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=self.stream.cuda_stream)
        pixels = [None if im is None else torch.as_tensor(im, device=self.device) for im in images]
        return pixels, [im for im in images if im is not None]


# Each image's output starts on this boundary in its batch's buffer (nvJPEG's own allocations are aligned as much).
_OUTPUT_ALIGN = 256
# nvJPEG states that may decode a batch side by side, each on its own thread (a call blocks until its images are
# done), and the fewest images a lane is given. Two lanes ran the engine's stream over 10,000 files at 6,595 img/s
# against one's 6,194 in one H200 run (bench/NOTES.md); one stays the default until the GPU tests pass with two.
HARDWARE_LANES = 1
_LANE_MIN = 8


class NvjpegHardwareDecoder(_GpuJpegDecoder):
    """JPEGs on the GPU's hardware JPEG decoders through nvJPEG's C API (`images/nvjpeg_hardware.py`): each JPEG's
    header checked by nvJPEG holding the GIL, a batch decoded in one call that lets go of it once, into one output
    buffer for the batch (an earlier batch's, once released, where it is large enough). EXIF orientation is applied
    after decoding; what the hardware does not take (progressive, CMYK, 4:1:1, other formats) goes to the CPU pool.
    The pixels are nvImageCodec's hardware decoder's (the same nvJPEG call), within a level of OpenCV's."""

    name = "hardware"
    # Its `finish` is one long call that lets go of the GIL while the hardware decodes: a feed prepares the next
    # images on another thread meanwhile (yolojet/engine/feed.py), which then calls `finish` too, while the first call
    # may still be running: the nvJPEG state's calls are serialised by `NvjpegHardware`'s lock, and each call's barrier
    # on the stream orders it after the one before.
    blocking_finish = True

    def __init__(self, cpu: CpuDecoder, lanes: int = HARDWARE_LANES) -> None:
        from yolojet.images.nvjpeg_hardware import NvjpegHardware

        super().__init__(cpu)
        self._lanes: list[NvjpegHardware] = []
        self._helpers: ThreadPoolExecutor | None = None
        try:
            with torch.cuda.device(self.device):
                for _ in range(lanes):
                    self._lanes.append(NvjpegHardware())
        except EngineConfigError:
            self.close_lanes()
            raise
        self._hardware = self._lanes[0]
        if lanes > 1:  # the other lanes' calls, each on a thread of its own set to this device
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._helpers = ThreadPoolExecutor(
                lanes - 1,
                thread_name_prefix="yolojet-hardware-lane",
                initializer=torch.cuda.set_device,
                initargs=(index,),
            )
        try:  # a first decode, checked: a GPU without hardware decoders may still make a handle
            probe = Pending(Encoded(_probe_jpeg(), "probe"), data=_probe_jpeg(), size=(48, 64))
            pixels = self._decode_jpegs([probe], None)[0][0] if self._hardware.takes(_probe_jpeg()) else None
            self.stream.synchronize()
            colour = torch.tensor(_PROBE_RGB, dtype=torch.int16)
            decodes = pixels is not None and bool((pixels.cpu().to(torch.int16) - colour).abs().max() <= 2)
        except Exception:
            self.close_lanes()
            raise
        if not decodes:
            self.close_lanes()
            raise EngineConfigError(
                f"decoder 'hardware': the hardware JPEG decoder of {torch.cuda.get_device_name(self.device)} did not "
                "decode a test image; use decoder='cpu'"
            )

    def describe(self) -> str:
        engines = f"{self._hardware.engines} engines of {self._hardware.cores}" if self._hardware.engines else "some"
        return f"hardware (nvJPEG on {engines} hardware JPEG decoders; other images on {self.cpu.describe()})"

    def close_lanes(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        for lane in self._lanes:
            lane.close()

    def close(self) -> None:
        self.close_lanes()
        super().close()

    def _takes(self, info: EncodedInfo) -> bool:
        return info.jpeg is not None and not info.jpeg.progressive and info.jpeg.components in (1, 3)

    def _decode_call(self, datas: list[bytes], outputs: list[tuple[int, int]]) -> int:
        """The batch decoded, split between the lanes (nvJPEG states decoding side by side) when each gets at least
        `_LANE_MIN` images; nvJPEG's status, 0 where every lane's call succeeded."""
        stream = self.stream.cuda_stream
        count = len(datas)
        if self._helpers is None or count < 2 * _LANE_MIN:
            return self._hardware.decode(datas, outputs, stream)
        share = max(_LANE_MIN, -(-count // len(self._lanes)))
        parts = [(i, i + share) for i in range(0, count, share)]
        others = [
            self._helpers.submit(lane.decode, datas[a:b], outputs[a:b], stream)
            for lane, (a, b) in zip(self._lanes[1:], parts[1:], strict=False)
        ]
        first = self._hardware.decode(datas[parts[0][0] : parts[0][1]], outputs[parts[0][0] : parts[0][1]], stream)
        statuses = [first, *(f.result() for f in others)]
        return next((status for status in statuses if status != 0), 0)

    def prepare(self, item: Encoded, data: bytes | None = None) -> Pending:
        """A local file wholly in the page cache is read holding the GIL (`read_cached_file`), any other the ordinary
        way; nvJPEG then checks the header of a JPEG the hardware may take."""
        if data is None and isinstance(item.source, (str, Path)):
            data = read_cached_file(str(item.source))
        pending = super().prepare(item, data)
        # Its output is sized from the header as yolojet reads it: a JPEG nvJPEG reads another size in goes to the CPU
        # pool, so that nvJPEG never writes past the images it is given.
        if pending.for_the_gpu and pending.data is not None and self._hardware.takes(pending.data) != pending.size:
            return self.cpu.submit(item, pending.data, checked=True)
        return pending

    def _queued_work_done(self) -> None:
        """nvJPEG's hardware engine does not wait for the work queued before it on the stream it is given (seen on
        H100s, and fixed so in torchcodec's nvJPEG decoder): a buffer the caching allocator just handed back may still
        be read by kernels queued on this stream. Only a host barrier orders it; the call blocks until its images
        are done anyway, so the barrier costs what the queued work had left."""
        self.stream.synchronize()

    def _decode_jpegs(
        self, jpegs: list[Pending], pool: OutputPool | None, entering: threading.Event | None = None
    ) -> tuple[list[torch.Tensor | None], list[Any]]:
        # The images of one stored size lie one after another in the buffer, so that their frames are made by two
        # tensor ops for the size rather than two an image (each lets go of the GIL and waits to take it back).
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(jpegs):
            groups.setdefault(p.size, []).append(i)
        starts: dict[tuple[int, int], int] = {}
        end = 0
        for (height, width), members in groups.items():
            starts[height, width] = end
            end += -(-len(members) * height * width * 3 // _OUTPUT_ALIGN) * _OUTPUT_ALIGN
        buffer = pool.take_buffer(end) if pool is not None else None
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if buffer is None:
                buffer = torch.empty(end, dtype=torch.uint8, device=self.device)
            base = buffer.data_ptr()
            outputs: list[tuple[int, int]] = [(0, 0)] * len(jpegs)
            for (height, width), members in groups.items():
                for j, i in enumerate(members):
                    outputs[i] = (base + starts[height, width] + j * height * width * 3, width * 3)
            datas = [p.data or b"" for p in jpegs]
            self._queued_work_done()
            if entering is not None:
                entering.set()
            if self._decode_call(datas, outputs) == 0:
                decoded = [True] * len(jpegs)
            else:  # one image the header check let through failed the call: each alone, to find it
                self.stream.synchronize()  # whatever the failed call left queued is done before the first write
                alone = zip(datas, outputs, strict=True)
                decoded = [self._hardware.decode([d], [o], self.stream.cuda_stream) == 0 for d, o in alone]
            pixels: list[torch.Tensor | None] = [None] * len(jpegs)
            for (height, width), members in groups.items():
                size = len(members) * height * width * 3
                at = starts[height, width]
                frames = buffer[at : at + size].view(len(members), height, width, 3).unbind(0)
                for i, frame in zip(members, frames, strict=True):
                    if decoded[i]:
                        pixels[i] = _upright(frame, jpegs[i].orientation)
        return pixels, [buffer]


class NvjpegDecoder(_GpuJpegDecoder):
    """torchvision's nvJPEG on the SMs, one batched call a batch (by name only: its pixels are not OpenCV's); EXIF
    orientation applied after decoding; refusals and other formats on the CPU pool."""

    name = "nvjpeg"

    def describe(self) -> str:
        return f"nvjpeg (torchvision's nvJPEG on the GPU's SMs; other images on {self.cpu.describe()})"

    def _decode_jpegs(
        self, jpegs: list[Pending], pool: OutputPool | None, entering: threading.Event | None = None
    ) -> tuple[list[torch.Tensor | None], list[Any]]:
        from torchvision.io import ImageReadMode, decode_jpeg

        encoded = [torch.frombuffer(bytearray(p.data or b""), dtype=torch.uint8) for p in jpegs]
        orientations = [p.orientation for p in jpegs]
        with torch.cuda.stream(self.stream):
            try:
                images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one bad image fails the batched call: decode one by one to find it
                images = []
                for one in encoded:
                    try:
                        images.append(decode_jpeg(one, mode=ImageReadMode.RGB, device=self.device))
                    except RuntimeError:
                        images.append(None)
            frames = [
                None if im is None else _upright(im.permute(1, 2, 0), o)
                for im, o in zip(images, orientations, strict=True)
            ]
            return frames, []  # torch's allocator recycles its memory already


def _upright(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """(H, W, C) pixels as stored → upright, for EXIF orientations 1-8 (as cv2.imread and PIL's exif_transpose)."""
    if orientation in (5, 6, 7, 8):
        pixels = pixels.transpose(0, 1)  # 5: transpose; 6 = 5 + mirror, 8 = 5 + flip, 7 = 5 + both
    mirror = orientation in (2, 3, 6, 7)
    flip = orientation in (3, 4, 7, 8)
    if mirror:
        pixels = pixels.flip(1)
    if flip:
        pixels = pixels.flip(0)
    return pixels


Decoder = CpuDecoder | HardwareJpegDecoder | NvjpegHardwareDecoder | NvjpegDecoder


def make_decoder(name: str, device: torch.device, max_pixels: int = DEFAULT_MAX_PIXELS) -> Decoder:
    """The decoder `name` (DECODER_NAMES) for frames wanted on `device`; `auto` picks as the module says."""
    if name not in DECODER_NAMES:
        raise EngineConfigError(f"decoder {name!r}: expected one of {', '.join(DECODER_NAMES)}")
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise EngineConfigError(f"max_pixels {max_pixels!r}: expected a positive int")
    cpu = CpuDecoder(device, max_pixels)
    if name == "cpu":
        return cpu
    if device.type != "cuda":
        if name == "auto":
            return cpu
        cpu.close()
        raise EngineConfigError(f"decoder {name!r} decodes on a CUDA GPU, and this engine runs on {device}")
    if name == "nvjpeg":
        return NvjpegDecoder(cpu)
    if name in ("hardware", "auto"):
        try:
            return NvjpegHardwareDecoder(cpu)
        except EngineConfigError:
            if name == "auto":  # no hardware decoders here (or no nvJPEG): the CPU pool
                return cpu
            cpu.close()
            raise
    try:
        return HardwareJpegDecoder(cpu)
    except EngineConfigError:
        cpu.close()
        raise
