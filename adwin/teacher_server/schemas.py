"""Request bodies of the teacher server (the OpenAI completions fields it reads) and its error body.

Fields it does not read are ignored, as vLLM ignores them; fields it reads are strictly typed (a string, a float
or a boolean where token ids or counts belong is a 400, never a coercion). Limits that depend on the served model
(ids below the vocabulary, the context, ``max_logprobs``) are checked by the route, naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from pydantic_core import PydanticCustomError


class CompletionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="the served model's name (GET /v1/models); absent: that model")
    prompt: list[list[StrictInt]] | list[StrictInt] = Field(
        description="token ids: one sequence, or a list of sequences (each scored as its own choice)")
    max_tokens: StrictInt = Field(1, ge=0, le=1, description="0: score only; 1: also the argmax next token "
                                  "(this server scores, it does not generate longer completions)")
    echo: StrictBool = Field(False, description="legacy form: the choice's logprobs cover the prompt tokens too")
    logprobs: StrictInt | None = Field(None, ge=-1, description="top logprobs per token of the choice's logprobs "
                                       "(-1: the whole vocabulary)")
    prompt_logprobs: StrictInt | None = Field(None, ge=-1, description="vLLM form: top logprobs per prompt token "
                                              "(-1: the whole vocabulary)")
    return_tokens_as_token_ids: StrictBool = Field(False, description="spell tokens as 'token_id:N'")
    temperature: float | None = Field(None, ge=0.0, strict=True, allow_inf_nan=False, description=(
        "accepted and not applied: logprobs and prompt_logprobs are of the raw distribution whatever the "
        "temperature, as vLLM computes prompt logprobs; the generated token is the argmax"))
    n: Literal[1] = Field(1, description="one choice per prompt")
    stream: Literal[False] = Field(False, description="no streaming")

    @field_validator("n", mode="before")
    @classmethod
    def _n_is_an_int(cls, value: Any) -> Any:  # a Literal compares by ==: 1.0 and True would pass as 1
        if isinstance(value, bool) or not isinstance(value, int):
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        return value

    @field_validator("stream", mode="before")
    @classmethod
    def _stream_is_a_bool(cls, value: Any) -> Any:  # 0 would pass as False
        if not isinstance(value, bool):
            raise PydanticCustomError("bool_type", "Input should be a valid boolean")
        return value

    def sequences(self) -> list[list[int]]:
        if not self.prompt:
            return []
        if isinstance(self.prompt[0], list):
            return [list(p) for p in self.prompt]  # type: ignore[arg-type]
        return [list(self.prompt)]  # type: ignore[arg-type]


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowed",
               413: "RequestTooLarge", 503: "ServiceUnavailableError"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="the request field at fault, e.g. 'prompt[1][3]'; null when none")
    code: int


class ErrorOut(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape (``ErrorOut``; ``adwin.teacher.client.error_detail`` reads it)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "InternalServerError"), "param": param,
                      "code": status}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route's OpenAPI entry for the error statuses it answers."""
    return {s: {"model": ErrorOut, "description": ERROR_TYPES[s]} for s in statuses}
