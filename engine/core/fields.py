"""The contract's bounded fields as pydantic types, defined once for the two schemas that read
them: the wire messages (``streaming.messages``) and the input log (``engine.core.inputlog``).
The bounds themselves are :mod:`engine.core.limits`'s."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from worldstream.engine.core.limits import (
    DIRECTION_KEYS,
    MAX_CHUNK_FRAMES,
    MAX_FORK_BRANCHES,
    MAX_MEMORY_FRAMES,
    MAX_POINTER_DELTA,
    MAX_PROMPT_CHARS,
    MAX_REWIND_CHUNKS,
    MAX_SAY_CHARS,
    MAX_STEPS,
    MIN_MEMORY_FRAMES,
    WIRE_KEY_PATTERN,
)

#: a prompt (either of a blend's two)
PromptText = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
#: the avatar's speech text
SayText = Annotated[str, Field(min_length=1, max_length=MAX_SAY_CHARS)]
#: denoising steps per chunk
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
#: frames per chunk
ChunkFrames = Annotated[int, Field(ge=1, le=MAX_CHUNK_FRAMES)]
#: frames of past context attended
MemoryFrames = Annotated[int, Field(ge=MIN_MEMORY_FRAMES, le=MAX_MEMORY_FRAMES)]
#: branches of one fork
ForkBranches = Annotated[int, Field(ge=1, le=MAX_FORK_BRANCHES)]
#: one branch of a fork (its index)
Branch = Annotated[int, Field(ge=0, lt=MAX_FORK_BRANCHES)]
#: chunks one rewind goes back
RewindChunks = Annotated[int, Field(ge=1, le=MAX_REWIND_CHUNKS)]
#: one axis of a pointer delta, CSS pixels (finite: JSON has no NaN, pydantic refuses inf)
PointerDelta = Annotated[float, Field(ge=-MAX_POINTER_DELTA, le=MAX_POINTER_DELTA,
                                      allow_inf_nan=False)]


#: validation context ``{"keys": ANY_KEY}``: any key name of ``WIRE_KEY_PATTERN`` (a log of a
#: backend with keys of its own, read before the backend is loaded: the backend checks them)
ANY_KEY = "*"
_WIRE_KEY = re.compile(WIRE_KEY_PATTERN)


def _expected(keys: tuple[str, ...]) -> str:
    names = [repr(k) for k in keys]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"


def _held_key(value: Any, info: ValidationInfo) -> str:
    """One held key: one of ``DIRECTION_KEYS``, or of the validation context's ``keys`` (the
    backend's ``wire_keys``) where one is given; else ``literal_error`` as a Literal gives."""
    keys = (info.context or {}).get("keys") or DIRECTION_KEYS
    if keys == ANY_KEY:
        if isinstance(value, str) and _WIRE_KEY.fullmatch(value):
            return value
        raise PydanticCustomError("string_pattern_mismatch",
                                  "String should match pattern '{pattern}'",
                                  {"pattern": WIRE_KEY_PATTERN})
    if not isinstance(value, str) or value not in keys:
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": _expected(tuple(keys))})
    return value


#: a held key of an ``action`` (message or log event): ``DIRECTION_KEYS`` unless the
#: validation context names the backend's own (``{"keys": backend.wire_keys}``)
HeldKey = Annotated[Any, AfterValidator(_held_key)]
