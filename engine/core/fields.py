"""The contract's bounded fields as pydantic types, defined once for the two schemas that read
them: the wire messages (``streaming.messages``) and the input log (``engine.core.inputlog``).
The bounds themselves are :mod:`engine.core.limits`'s."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from worldstream.engine.core.limits import (
    MAX_CHUNK_FRAMES,
    MAX_FORK_BRANCHES,
    MAX_MEMORY_FRAMES,
    MAX_PROMPT_CHARS,
    MAX_REWIND_CHUNKS,
    MAX_SAY_CHARS,
    MAX_STEPS,
    MIN_MEMORY_FRAMES,
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
