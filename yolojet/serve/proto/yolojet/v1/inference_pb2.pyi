from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InferRequest(_message.Message):
    __slots__ = ("id", "model", "image", "conf", "iou", "max_det", "classes")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CONF_FIELD_NUMBER: _ClassVar[int]
    IOU_FIELD_NUMBER: _ClassVar[int]
    MAX_DET_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    image: bytes
    conf: float
    iou: float
    max_det: int
    classes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., image: _Optional[bytes] = ..., conf: _Optional[float] = ..., iou: _Optional[float] = ..., max_det: _Optional[int] = ..., classes: _Optional[_Iterable[int]] = ...) -> None: ...

class Box(_message.Message):
    __slots__ = ("x1", "y1", "x2", "y2")
    X1_FIELD_NUMBER: _ClassVar[int]
    Y1_FIELD_NUMBER: _ClassVar[int]
    X2_FIELD_NUMBER: _ClassVar[int]
    Y2_FIELD_NUMBER: _ClassVar[int]
    x1: float
    y1: float
    x2: float
    y2: float
    def __init__(self, x1: _Optional[float] = ..., y1: _Optional[float] = ..., x2: _Optional[float] = ..., y2: _Optional[float] = ...) -> None: ...

class RotatedBox(_message.Message):
    __slots__ = ("cx", "cy", "width", "height", "angle")
    CX_FIELD_NUMBER: _ClassVar[int]
    CY_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ANGLE_FIELD_NUMBER: _ClassVar[int]
    cx: float
    cy: float
    width: float
    height: float
    angle: float
    def __init__(self, cx: _Optional[float] = ..., cy: _Optional[float] = ..., width: _Optional[float] = ..., height: _Optional[float] = ..., angle: _Optional[float] = ...) -> None: ...

class Keypoint(_message.Message):
    __slots__ = ("x", "y", "visibility")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_FIELD_NUMBER: _ClassVar[int]
    x: float
    y: float
    visibility: float
    def __init__(self, x: _Optional[float] = ..., y: _Optional[float] = ..., visibility: _Optional[float] = ...) -> None: ...

class Mask(_message.Message):
    __slots__ = ("height", "width", "counts")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    counts: str
    def __init__(self, height: _Optional[int] = ..., width: _Optional[int] = ..., counts: _Optional[str] = ...) -> None: ...

class Detection(_message.Message):
    __slots__ = ("confidence", "class_id", "class_name", "box", "rotated_box", "keypoints", "mask")
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    CLASS_ID_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    ROTATED_BOX_FIELD_NUMBER: _ClassVar[int]
    KEYPOINTS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    confidence: float
    class_id: int
    class_name: str
    box: Box
    rotated_box: RotatedBox
    keypoints: _containers.RepeatedCompositeFieldContainer[Keypoint]
    mask: Mask
    def __init__(self, confidence: _Optional[float] = ..., class_id: _Optional[int] = ..., class_name: _Optional[str] = ..., box: _Optional[_Union[Box, _Mapping]] = ..., rotated_box: _Optional[_Union[RotatedBox, _Mapping]] = ..., keypoints: _Optional[_Iterable[_Union[Keypoint, _Mapping]]] = ..., mask: _Optional[_Union[Mask, _Mapping]] = ...) -> None: ...

class ClassScore(_message.Message):
    __slots__ = ("class_id", "class_name", "confidence")
    CLASS_ID_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    class_id: int
    class_name: str
    confidence: float
    def __init__(self, class_id: _Optional[int] = ..., class_name: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "decode_ms", "run_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    decode_ms: float
    run_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., run_ms: _Optional[float] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "reason", "retry_delay_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    retry_delay_ms: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., retry_delay_ms: _Optional[int] = ...) -> None: ...

class InferReply(_message.Message):
    __slots__ = ("id", "model", "model_version", "width", "height", "task", "detections", "top5", "timings", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DETECTIONS_FIELD_NUMBER: _ClassVar[int]
    TOP5_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    model_version: str
    width: int
    height: int
    task: str
    detections: _containers.RepeatedCompositeFieldContainer[Detection]
    top5: _containers.RepeatedCompositeFieldContainer[ClassScore]
    timings: Timings
    error: Error
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., task: _Optional[str] = ..., detections: _Optional[_Iterable[_Union[Detection, _Mapping]]] = ..., top5: _Optional[_Iterable[_Union[ClassScore, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class InferBatch(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[InferRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[InferRequest, _Mapping]]] = ...) -> None: ...

class InferBatchReply(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[InferReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[InferReply, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "task", "max_batch", "height", "width", "class_names", "backend", "decoder", "keypoint_shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    KEYPOINT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    task: str
    max_batch: int
    height: int
    width: int
    class_names: _containers.RepeatedScalarFieldContainer[str]
    backend: str
    decoder: str
    keypoint_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., task: _Optional[str] = ..., max_batch: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., class_names: _Optional[_Iterable[str]] = ..., backend: _Optional[str] = ..., decoder: _Optional[str] = ..., keypoint_shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ListModelsReply(_message.Message):
    __slots__ = ("models", "max_message_bytes", "processes", "process_index")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_INDEX_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    max_message_bytes: int
    processes: int
    process_index: int
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., max_message_bytes: _Optional[int] = ..., processes: _Optional[int] = ..., process_index: _Optional[int] = ...) -> None: ...
