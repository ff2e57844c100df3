"""Request bodies of the teacher server (the OpenAI completions fields it reads) and its error body.

Fields it does not read are ignored, as vLLM ignores them; fields it reads are strictly typed (a string where
token ids belong is a 400, never a coercion). Limits that depend on the served model (ids below the vocabulary,
the context, ``max_logprobs``) are checked by the route, naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt


class CompletionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="the served model's name (GET /v1/models); absent: that model")
    prompt: list[list[StrictInt]] | list[StrictInt] = Field(
        description="token ids: one sequence, or a list of sequences (each scored as its own choice)")
    max_tokens: StrictInt = Field(1, ge=0, le=1, description="0: score only; 1: also the argmax next token "
                                  "(this server scores, it does not generate longer completions)")
    echo: StrictBool = Field(False, description="legacy form: the choice's logprobs cover the prompt tokens too")
    logprobs: StrictInt | None = Field(None, ge=0, description="top logprobs per token of the choice's logprobs")
    prompt_logprobs: StrictInt | None = Field(None, ge=0, description="vLLM form: top logprobs per prompt token")
    return_tokens_as_token_ids: StrictBool = Field(False, description="spell tokens as 'token_id:N'")
    temperature: float | None = Field(None, ge=0.0, description="accepted; logprobs are the raw distribution "
                                      "(temperature 1), as vLLM's default logprobs mode")
    n: Literal[1] = Field(1, description="one choice per prompt")
    stream: Literal[False] = Field(False, description="no streaming")

    def sequences(self) -> list[list[int]]:
        if not self.prompt:
            return []
        if isinstance(self.prompt[0], list):
            return [list(p) for p in self.prompt]  # type: ignore[arg-type]
        return [list(self.prompt)]  # type: ignore[arg-type]


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape (``adwin.backends.teacher_client.error_detail`` reads it)."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowed",
            413: "RequestTooLarge", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
