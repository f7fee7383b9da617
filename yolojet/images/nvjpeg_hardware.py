"""The GPU's hardware JPEG decoders (A100 / H100 / H200 class) through nvJPEG's own C API, loaded with ctypes.

nvImageCodec (the `nvimgcodec` decoder) drives the same nvJPEG calls, but its Python bindings let go of the GIL and
take it back twice an image during a batched decode, and each time back waits behind any other thread of the process
running Python: on an H200 a call of 64 images fell from 8,918 to 59 img/s beside one busy thread (bench/NOTES.md).
Here the per-image work is short C calls made holding the GIL (`ctypes.PyDLL`: a header parse and nvJPEG's own
"can the hardware take it" check), and a whole batch is one call that lets go of the GIL once (`ctypes.CDLL`).

The library is the `nvidia-nvjpeg` wheel's (`nvidia/<cuda>/lib/libnvjpeg.so.*`, a dependency on Linux), else one the
system's loader finds (a CUDA toolkit). It links the CUDA runtime statically, so it needs only the driver.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from importlib.util import find_spec
from pathlib import Path

from yolojet.errors import EngineConfigError

_BACKEND_HARDWARE = 3  # nvjpegBackend_t NVJPEG_BACKEND_HARDWARE
_OUTPUT_RGBI = 5  # nvjpegOutputFormat_t: interleaved RGB in the first plane
_MAX_COMPONENT = 4
# Chroma upsampled by interpolation, as libjpeg-turbo's "fancy upsampling" (and so OpenCV and ultralytics) does: without
# it the hardware path's pixels differ from OpenCV's by up to 41 levels on bus.jpg (measured on an H200), with it by
# one, as nvImageCodec's (which sets it too).
_FLAGS_UPSAMPLING_WITH_INTERPOLATION = 1 << 5
_STATUS = {
    1: "not initialized",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed (no usable CUDA GPU?)",
    7: "architecture mismatch",
    8: "internal error",
    9: "implementation not supported (no hardware JPEG decoder on this GPU)",
    10: "incomplete bitstream",
}


class _Image(ctypes.Structure):
    """nvjpegImage_t: a pointer and a row pitch for each of up to four output planes."""

    _fields_ = [("channel", ctypes.c_void_p * _MAX_COMPONENT), ("pitch", ctypes.c_size_t * _MAX_COMPONENT)]


_P = ctypes.c_void_p
_PROTOTYPES: dict[str, tuple] = {  # argument types: size_t and pointers must not go as C ints
    "nvjpegCreateEx": (ctypes.c_int, _P, _P, ctypes.c_uint, ctypes.POINTER(_P)),
    "nvjpegDestroy": (_P,),
    "nvjpegJpegStateCreate": (_P, ctypes.POINTER(_P)),
    "nvjpegJpegStateDestroy": (_P,),
    "nvjpegJpegStreamCreate": (_P, ctypes.POINTER(_P)),
    "nvjpegJpegStreamDestroy": (_P,),
    "nvjpegGetHardwareDecoderInfo": (_P, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)),
    "nvjpegDecodeBatchedPreAllocate": (_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int),
    "nvjpegJpegStreamParseHeader": (_P, ctypes.c_char_p, ctypes.c_size_t, _P),
    "nvjpegDecodeBatchedSupported": (_P, _P, ctypes.POINTER(ctypes.c_int)),
    "nvjpegJpegStreamGetFrameDimensions": (_P, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)),
    "nvjpegDecodeBatchedInitialize": (_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int),
    "nvjpegDecodeBatched": (
        _P,
        _P,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(_Image),
        _P,
    ),
}


def _declared(library: ctypes.CDLL) -> ctypes.CDLL:
    for name, arguments in _PROTOTYPES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = arguments, ctypes.c_int
    return library


def find_library() -> str | None:
    """libnvjpeg's path: the nvidia-nvjpeg wheel's where it is installed, else the system loader's name for it."""
    spec = find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        shipped = sorted(p for root in spec.submodule_search_locations for p in Path(root).glob("*/lib/libnvjpeg.so*"))
        if shipped:
            return str(shipped[-1])
    return ctypes.util.find_library("nvjpeg")


def _status_text(status: int) -> str:
    return f"nvJPEG status {status}: {_STATUS.get(status, 'unknown')}"


class NvjpegHardware:
    """One nvJPEG handle on the hardware backend, for the current CUDA device of the thread that creates it (the
    caller sets it); `takes(data)` says whether the hardware decodes a JPEG, `decode(...)` decodes a batch.

    Safe to share between threads: nvJPEG's handle is, and its parsed stream (`takes`) and decoding state (`decode`)
    each have a lock of their own, so that a header check never waits for a batch's decode."""

    def __init__(self) -> None:
        path = find_library()
        if path is None:
            raise EngineConfigError("decoder 'hardware': nvJPEG's library is not installed (pip install nvidia-nvjpeg)")
        try:
            # The same library twice: calls through `_quick` hold the GIL (short header work, no round trip to
            # another thread), those through `_long` let go of it (the batch's decode).
            self._quick = _declared(ctypes.PyDLL(path))
            self._long = _declared(ctypes.CDLL(path))
        except (OSError, AttributeError) as e:  # not loadable, or too old a release for these calls
            raise EngineConfigError(f"decoder 'hardware': cannot load {path} ({e})") from e
        self._parsing = threading.Lock()
        self._decoding = threading.Lock()
        self._handle = ctypes.c_void_p()
        self._state = ctypes.c_void_p()
        self._stream = ctypes.c_void_p()
        status = self._long.nvjpegCreateEx(
            _BACKEND_HARDWARE, None, None, _FLAGS_UPSAMPLING_WITH_INTERPOLATION, ctypes.byref(self._handle)
        )
        if status != 0:
            raise EngineConfigError(f"decoder 'hardware': no hardware JPEG decoder here ({_status_text(status)})")
        try:
            self._check(self._quick.nvjpegJpegStateCreate(self._handle, ctypes.byref(self._state)), "state")
            self._check(self._quick.nvjpegJpegStreamCreate(self._handle, ctypes.byref(self._stream)), "stream")
            engines, cores = ctypes.c_uint(), ctypes.c_uint()
            if self._quick.nvjpegGetHardwareDecoderInfo(self._handle, ctypes.byref(engines), ctypes.byref(cores)) == 0:
                self.engines, self.cores = engines.value, cores.value
            else:
                self.engines, self.cores = 0, 0
            # nvImageCodec does the same: a preallocation, however small, turns on the hardware decoder's memory
            # pool, which it measured a fifth faster.
            self._quick.nvjpegDecodeBatchedPreAllocate(self._handle, self._state, 1, 1, 1, 0, _OUTPUT_RGBI)
        except EngineConfigError:
            self.close()
            raise

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise EngineConfigError(f"decoder 'hardware': nvJPEG's {what} could not be made ({_status_text(status)})")

    def takes(self, data: bytes) -> tuple[int, int] | None:
        """The (height, width) nvJPEG reads in this JPEG's header where the hardware decodes it (baseline, one scan, a
        sampling it knows), by nvJPEG's own check; None where it does not."""
        with self._parsing:
            if self._quick.nvjpegJpegStreamParseHeader(self._handle, data, len(data), self._stream) != 0:
                return None
            supported = ctypes.c_int(-1)
            if self._quick.nvjpegDecodeBatchedSupported(self._handle, self._stream, ctypes.byref(supported)) != 0:
                return None
            if supported.value != 0:  # 0: supported
                return None
            width, height = ctypes.c_uint(), ctypes.c_uint()
            if self._quick.nvjpegJpegStreamGetFrameDimensions(self._stream, ctypes.byref(width), ctypes.byref(height)):
                return None
            return height.value, width.value

    def decode(self, datas: list[bytes], outputs: list[tuple[int, int]], cuda_stream: int) -> int:
        """Decode `datas` (JPEGs `takes` accepted) into interleaved RGB at `outputs` ((device pointer, row pitch in
        bytes) each, large enough for the image) on `cuda_stream`; nvJPEG's status (0: every image decoded)."""
        n = len(datas)
        images = (_Image * n)()
        for image, (pointer, pitch) in zip(images, outputs, strict=True):
            image.channel[0] = pointer
            image.pitch[0] = pitch
        data = (ctypes.c_char_p * n)(*datas)
        lengths = (ctypes.c_size_t * n)(*(len(d) for d in datas))
        with self._decoding:
            status = self._quick.nvjpegDecodeBatchedInitialize(self._handle, self._state, n, 1, _OUTPUT_RGBI)
            if status != 0:
                return status
            return self._long.nvjpegDecodeBatched(self._handle, self._state, data, lengths, images, cuda_stream)

    def close(self) -> None:
        with self._parsing, self._decoding:
            if self._stream:
                self._quick.nvjpegJpegStreamDestroy(self._stream)
                self._stream = ctypes.c_void_p()
            if self._state:
                self._quick.nvjpegJpegStateDestroy(self._state)
                self._state = ctypes.c_void_p()
            if self._handle:
                self._quick.nvjpegDestroy(self._handle)
                self._handle = ctypes.c_void_p()
