"""LLM layer vocabulary: the configuration, the errors, and the message / result value types.

Everything else in :mod:`tasks.llm` builds on these; this module imports nothing from the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from tasks.core.limits import COUNT, COUNT0, POSITIVE, one_of, within
from tasks.core.stage import StageParams, from_config

Message = dict[str, Any]
Messages = list[Message]

PROVIDERS = ("none", "openai", "local")


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------
class LLMError(RuntimeError):
    """Base class for LLM-layer errors."""


class LLMConfigError(LLMError):
    """Invalid or incomplete LLM configuration (e.g. missing API key env var)."""


class LLMUnreachable(LLMError):
    """The endpoint kept failing with transient errors until retries ran out."""


class LLMRequestError(LLMError):
    """The endpoint rejected the request with a non-retryable 4xx status."""


class LLMBadResponse(LLMError):
    """The endpoint kept returning bodies that are not valid chat completions."""


class ExtractionMostlyEmpty(LLMError):
    """Too many outputs of an extraction stage were empty or invalid."""


class LLMDryRun(Exception):
    """Raised by an index stage in dry-run mode instead of calling the LLM: what it would spend.

    Nothing is written for that stage (the exception leaves ``compute`` before any write); the
    flow catches it, reports ``estimate`` and stops.
    """

    def __init__(self, stage: str, estimate: dict[str, int]) -> None:
        super().__init__(f"LLM dry run: stage {stage!r} would make {estimate}")
        self.stage, self.estimate = stage, estimate


# --------------------------------------------------------------------------
# Config and results
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LLMParams:
    """LLM configuration. ``api_key_env`` names the env var holding the key.

    ``json_mode`` controls whether :meth:`LLMClient.chat_json` sends
    ``response_format={"type": "json_object"}`` (some servers reject it).
    """

    provider: str = field(default="none", metadata=one_of(PROVIDERS))
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""
    temperature: float = field(default=0.0, metadata=within("[0, 2]"))
    max_tokens: int = field(default=512, metadata=COUNT)
    timeout_s: float = field(default=60.0, metadata=POSITIVE)
    max_retries: int = field(default=5, metadata=COUNT0)
    backoff_base_s: float = field(default=0.5, metadata=COUNT0)
    backoff_max_s: float = field(default=30.0, metadata=COUNT0)
    concurrency: int = field(default=8, metadata=COUNT)
    seed: int = 0
    json_mode: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise LLMConfigError("llm.concurrency >= 1, llm.max_retries >= 0 and llm.timeout_s > 0 required")


def llm_identity(llm: LLMParams | LLMReplyParams) -> dict:
    """What in the ``llm`` group changes an extraction: model and sampling, never the endpoint or key."""
    return {"model": llm.model, "temperature": llm.temperature, "seed": llm.seed, "json_mode": llm.json_mode}


@dataclass(frozen=True)
class LLMReplyParams(StageParams):
    """The ``llm`` settings that change a reply (:func:`llm_identity`; never the endpoint, key, concurrency or
    timeouts): the params of a stage that asks the chat model inherit them."""

    model: str = from_config("llm.model")
    temperature: float = from_config("llm.temperature")
    seed: int = from_config("llm.seed")
    json_mode: bool = from_config("llm.json_mode")


@dataclass(frozen=True)
class LLMResult:
    """One chat completion (fresh or from the cache)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    seconds: float
