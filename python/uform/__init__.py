"""UForm: a multimodal embedding engine, from Python.

The engine (include/uform.h) through its C extension, ``uform._uform``: executors that say where calls run
(inline, RAM threads, CUDA devices), models loaded from a format-4 checkpoint or a pretrained model's folder,
their encoders of texts, images, video clips and sounds answering NumPy arrays, the next-byte choice of a
byte-level text tower, tokenizers, and the checkpoint tools. Every blocking engine call runs without the
GIL; its outputs are copied out of the engine's arena into new arrays.

    import uform
    model = uform.Model("models/demo.safetensors")
    vectors = model.encode_texts(["a photo of a cat", "a dog"])    # float32, (2, model.info.dims)
    clips = model.encode_videos(["clip.mp4"])                       # the same space
    sounds = model.encode_audio([samples], rate=16000)              # float32 mono samples, or files
    column = pyarrow.array(uform.arrow(vectors))                    # FixedSizeList<float32>, no copy

Failures raise subclasses of ``uform.Error`` carrying the engine's ``status``, the C ``function`` that
failed and its ``message``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _uform
from ._uform import (
    ArrowRows,
    CancelledError,
    ContendedError,
    DeviceError,
    Error,
    Executor,
    FormatError,
    InputOutputError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    UnsupportedError,
    convert_checkpoint,
    features,
    hub_folder,
    kernels,
    quantize_checkpoint,
    status_name,
    tiny_checkpoint,
)

__version__ = "{}.{}.{}".format(*_uform.version)

__all__ = [
    "Answer", "ArrowRows", "CancelledError", "ContendedError", "DeviceError", "Encoded", "Error", "Executor",
    "FormatError", "InputOutputError", "InternalError", "InvalidArgumentError", "Model", "ModelInfo", "OutOfMemoryError",
    "Tokenized", "Tokenizer", "UnsupportedError", "arrow", "convert_checkpoint", "features", "hub_folder", "kernels",
    "quantize_checkpoint", "status_name", "tiny_checkpoint", "tokenize", "__version__",
]

Path = Union[str, "os.PathLike[str]"]
#: What the encoders answer: an array, or for dtype="int8" the pair (int8 rows, float32 scales).
Rows = Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is (uform_model_info_t)."""

    dims: int  #: the shared embedding width
    matryoshka: Tuple[int, ...]  #: ascending widths, each a valid embedding prefix (``dims=`` of the encoders)
    parameters: int  #: scalars in every tensor
    bytes: int  #: bytes of tensor data
    towers: Tuple[str, ...]  #: of "text", "image", "video", "audio"
    family: str  #: "uform" (the engine's own), or the pretrained family: "bert", "clip", "siglip", ...
    normalized: bool  #: embeddings are unit vectors as the family's reference gives them
    weights: str  #: "bf16" or "i8": the blocks' linear layers as the model runs them
    context: int  #: text bytes at most, or tokens at most where the model reads tokens
    vocab: int  #: 0: the text tower reads bytes; else token ids below it
    image_size: int  #: the image tower's input side in pixels (0 without one)
    video_frames: int  #: frames sampled per clip (0 without video)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """The outputs an encode was asked for with ``outputs=``; those not asked are None. Each is rows of the
    call's dtype (for "int8" the pair of int8 rows and their float32 scales)."""

    embeddings: Optional[Rows]  #: one row per item
    token_vectors: Optional[List[Rows]]  #: per item, one row per kept byte or token of a text, per patch of an image
    states: Optional[Rows]  #: per item, the tower's final state, ``hidden`` wide
    #: with token vectors of a model that reads tokens: per item, each token's bytes [begin, end) in its text
    #: (uint32 rows of two; special, padding and prompt tokens [0, 0))
    token_spans: Optional[List[np.ndarray]] = None


def arrow(rows: np.ndarray) -> ArrowRows:
    """The embeddings' rows (float32 or float16, items x width) as an Arrow array of
    FixedSizeList<float32>[width] without a copy: what ``pyarrow.array``, ``pyarrow.record_batch`` or any
    consumer of the Arrow PyCapsule protocol (``__arrow_c_array__``) takes. The Arrow array shares the rows'
    memory and keeps it alive until it is released."""
    return ArrowRows(rows)


#: What the encoders answer with their keywords: rows, an ``Encoded`` (``outputs=``), or ``ArrowRows`` (``arrow=True``).
Answer = Union[Rows, Encoded, ArrowRows]


def _split(rows: Rows, offsets: np.ndarray) -> List[Rows]:
    bounds = offsets.astype(np.intp)
    if isinstance(rows, tuple):
        return [(rows[0][a:b], rows[1][a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _encoded(result):
    """What the extension answered: the rows alone, or for ``outputs=`` a dict made an Encoded."""
    if not isinstance(result, dict):
        return result
    token_vectors, token_spans = result.get("token_vectors"), result.get("token_spans")
    return Encoded(embeddings=result.get("embeddings"), states=result.get("states"),
                   token_vectors=None if token_vectors is None else _split(*token_vectors),
                   token_spans=None if token_spans is None else _split(*token_spans))


def _wants_arrow(options: dict) -> bool:
    """Takes ``arrow=`` out of an encode's keywords: True answers the rows as ``arrow(rows)``, for the
    float32 or float16 embeddings alone."""
    wanted = bool(options.pop("arrow", False))
    if wanted and ("outputs" in options or options.get("dtype", "float32") not in ("float32", "float16")):
        raise ValueError("arrow=True answers the embeddings' rows of dtype float32 or float16 alone")
    return wanted


def _answer(result, as_arrow: bool) -> Answer:
    return arrow(result) if as_arrow else _encoded(result)


class Model(_uform.Model):
    """A model loaded into host memory, or into device memory on a VRAM executor.

    ``Model(path, *, executor=None, weights="stored", map=False)``: ``path`` is a format-4 checkpoint
    (``.safetensors``) or a pretrained model's folder (UForm 3, CLIP, SigLIP, BERT-family
    sentence-transformers), or where no such file or folder exists a hub id in the local Hugging Face cache
    ("sentence-transformers/all-MiniLM-L6-v2", see ``hub_folder``); ``executor`` where it loads and where its
    calls run by default (None: a new ``Executor.ram()``; an ``Executor.vram()`` loads it into its devices'
    memory, which takes no I8 weights); ``weights`` "stored", "bf16" or "i8"; ``map`` maps the file instead
    of reading it. A model may be used by several executors, one per thread, at once.
    """

    @property
    def info(self) -> ModelInfo:
        """The model's description."""
        return ModelInfo(**self._info())

    @property
    def tokenizer(self) -> "Tokenizer":
        """The tokenizer of a model that reads tokens, cutting as its text verbs do (truncated at its
        context, never padded); it keeps the model alive. Raises ``UnsupportedError`` for a model that reads
        bytes."""
        return Tokenizer._of_model(self)

    def encode_texts(self, texts: Sequence[Union[str, bytes]], **options) -> Answer:
        """Embeds texts (str, encoded as UTF-8, or bytes), blocking on the executor without the GIL.

        Keywords: ``executor`` (default the model's), ``dims`` (a matryoshka width), ``normalize`` (unit
        vectors whatever the family), ``prompt`` or ``prompt_name`` (models that read tokens), ``progress``
        (a callable (completed, total); False cancels), ``dtype`` ("float32", "float16", "bfloat16" as its
        uint16 bits, or "int8": the pair of rows and scales), ``outputs`` (names among "embeddings",
        "token_vectors", "states": an ``Encoded`` of them instead of the embeddings' rows), ``arrow`` (True:
        the rows as ``arrow(rows)``, an Arrow array of FixedSizeList<float32> sharing them)."""
        as_arrow = _wants_arrow(options)
        return _answer(super().encode_texts(texts, **options), as_arrow)

    def encode_images(self, images: Sequence[Union[Path, bytes, np.ndarray]], **options) -> Answer:
        """Embeds images: JPEG or PNG paths or encoded files, or RGB8 pixels (uint8 arrays of height x width x
        3), one kind per call; keywords as ``encode_texts``'s, less the prompts."""
        as_arrow = _wants_arrow(options)
        return _answer(super().encode_images(images, **options), as_arrow)

    def encode_videos(self, videos: Sequence[Union[Path, bytes]], **options) -> Answer:
        """Embeds video clips: paths or encoded files in any container and codec FFmpeg decodes, one kind per
        call. A clip's embedding is the normalized mean of its ``info.video_frames`` sampled frames' image
        embeddings, its token vectors those frames' embeddings, its state the mean of their states. Keywords
        as ``encode_images``'s."""
        as_arrow = _wants_arrow(options)
        return _answer(super().encode_videos(videos, **options), as_arrow)

    def encode_audio(self, sounds: Sequence[Union[Path, bytes, np.ndarray]], **options) -> Answer:
        """Embeds sounds: paths or encoded files in any format FFmpeg decodes (downmixed to mono, resampled to
        the model's rate), or mono samples (float32 arrays of one dimension) at ``rate`` Hz, one kind per
        call. Samples at the model's rate are read as they stand: they give what a float32 WAV of them gives,
        bit for bit. Keywords as ``encode_images``'s, and ``rate`` for samples."""
        as_arrow = _wants_arrow(options)
        return _answer(super().encode_audio(sounds, **options), as_arrow)

    async def aencode_texts(self, texts: Sequence[Union[str, bytes]], **options) -> Answer:
        """``encode_texts`` awaited: submitted deferred on the executor, whose notification the running
        asyncio loop watches, so that the loop goes on while the engine works. Give concurrent calls an
        executor each (``executor=``): a held executor raises ``ContendedError``."""
        return await _deferred(self.encode_texts, self.submit_texts, texts, options)

    async def aencode_images(self, images: Sequence[Union[Path, bytes, np.ndarray]], **options) -> Answer:
        """``encode_images`` awaited, as ``aencode_texts``."""
        return await _deferred(self.encode_images, self.submit_images, images, options)

    async def aencode_videos(self, videos: Sequence[Union[Path, bytes]], **options) -> Answer:
        """``encode_videos`` awaited, as ``aencode_texts``."""
        return await _deferred(self.encode_videos, self.submit_videos, videos, options)

    async def aencode_audio(self, sounds: Sequence[Union[Path, bytes, np.ndarray]], **options) -> Answer:
        """``encode_audio`` awaited, as ``aencode_texts``."""
        return await _deferred(self.encode_audio, self.submit_audio, sounds, options)

    def choose(self, texts: Sequence[Union[str, bytes]], choices: Sequence[Union[str, bytes]], *,
               executor: Optional[Executor] = None, progress=None) -> List[np.ndarray]:
        """The next byte of each text, among its legal ones: ``choices[i]`` lists text i's legal next bytes
        (bytes, or str as its UTF-8 bytes; none repeated), and the answer's item i holds their probabilities
        (float32, in that order, summing to 1): the softmax of the text's final state against the tied byte
        table. For models that read bytes (``info.vocab == 0``); one that reads tokens raises
        ``UnsupportedError``. Blocking on the executor without the GIL; ``progress`` as ``encode_texts``'s,
        counting items."""
        probabilities, offsets = self._choose(texts, choices, executor=executor, progress=progress)
        return _split(probabilities, offsets)


async def _deferred(encode, submit, items, options: dict) -> Answer:
    """An encode awaited: ``submit`` deferred and awaited, or ``encode`` for no item (nothing to submit)."""
    if len(items) == 0:
        return encode(items, **options)
    as_arrow = _wants_arrow(options)
    return _answer(await _awaited(submit(items, **options)), as_arrow)


async def _awaited(call: "_uform.Call") -> Rows:
    """The result of a deferred call, once its descriptor turns readable. A cancelled task leaves the call to
    finish in the engine; the call waits for it when it is dropped."""
    if not call.done():
        loop = asyncio.get_running_loop()
        final = loop.create_future()
        descriptor = call.fileno()
        loop.add_reader(descriptor, lambda: final.done() or final.set_result(None))
        try:
            await final
        finally:
            loop.remove_reader(descriptor)
    return call.result()


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """The tokens of each text: ``ids[i]`` (uint32) and ``spans[i]`` (uint32, one [begin, end) pair of input
    bytes per token, [0, 0) for the special tokens the tokenizer adds)."""

    ids: List[np.ndarray]
    spans: List[np.ndarray]


class Tokenizer(_uform.Tokenizer):
    """A tokenizer cutting texts as Hugging Face's ``tokenizers`` does from the same file.

    ``Tokenizer(path)``: a ``tokenizer.json``, a SentencePiece model, or a model's folder holding one;
    ``Tokenizer.parse(json)`` the bytes of a tokenizer.json; ``Model.tokenizer`` a model's own.
    ``info`` is a dict: vocabulary, max_length, special_added, model. ``token(id)`` is the string of an id.
    """

    def tokenize(self, texts: Sequence[Union[str, bytes]], *, special_tokens: bool = True,
                 executor: Optional[Executor] = None) -> Tokenized:
        """Cuts every text (str, or UTF-8 bytes) into token ids and byte spans; without ``special_tokens``
        the post-processor's tokens are left out. ``executor`` None runs on the calling thread."""
        ids, spans, offsets = self._tokenize(texts, special_tokens=special_tokens, executor=executor)
        if offsets is None:
            return Tokenized([], [])
        bounds = offsets.astype(np.intp)
        return Tokenized([ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])],
                         [spans[a:b] for a, b in zip(bounds[:-1], bounds[1:])])


def tokenize(path: Path, texts: Sequence[Union[str, bytes]], *, special_tokens: bool = True) -> Tokenized:
    """``Tokenizer(path).tokenize(texts)``: opens the tokenizer for this one call."""
    return Tokenizer(path).tokenize(texts, special_tokens=special_tokens)
