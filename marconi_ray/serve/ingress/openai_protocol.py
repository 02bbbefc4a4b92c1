"""The subset of the OpenAI HTTP API we serve: request, response and error models, and the
conversion of a request into the engine's `SamplingParams`.

Decisions (documented contract):
- Unknown request fields are ignored (as vLLM does; OpenAI itself rejects them), but known
  fields are validated strictly: a wrong type (`"max_tokens": "16"`, `"stream": 1`, a bool
  where a number is expected) is a 400 naming the field, never silently coerced.
- Every error is `ErrorResponse` JSON; `APIError` carries the status, message, the
  offending parameter and an optional machine-readable code.
- `max_tokens` above the model's context limit is a 400; a `max_tokens` that fits the
  limit but not next to the prompt is capped (the request finishes with `length`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from marconi_ray.protocol.sampling import MAX_LOGPROBS, SamplingParams
from marconi_ray.serve.ingress.tools.fields import (
    MAX_TOOLS,
    ResponseFormat,
    ToolCallIn,
    ToolChoice,
    ToolDef,
)

MAX_STOP_STRINGS = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed overflows beyond it

_REQUEST = ConfigDict(extra="ignore", strict=True)


# ---------------------------------------------------------------------- errors
def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    if 400 <= status < 500:
        return "invalid_request_error"
    return "service_unavailable" if status == 503 else "server_error"


class ErrorDetail(BaseModel):
    message: str = Field(description="Human-readable description naming the bad value.")
    type: str = Field(description="`invalid_request_error` (4xx) or `server_error`/...")
    param: str | None = Field(default=None, description="The request parameter at fault, if any.")
    code: str | None = Field(
        default=None, description="Machine-readable code, e.g. model_not_found."
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail = Field(description="What went wrong.")


class APIError(Exception):
    """An HTTP error with OpenAI's error body; raised by request handling, rendered once."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        """Sent as the `Retry-After` header (429, 503) when set."""

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(
            message=self.message, type=error_type(self.status), param=self.param, code=self.code
        )
        return ErrorResponse(error=detail).model_dump()


# Parts of a pydantic error location that name a union member or a validator, not a field.
_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*|[A-Z]\w*)$")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and _TAG.match(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(exc: ValidationError) -> APIError:
    """A 400 for the first error of a pydantic validation, naming its field and input."""
    err = exc.errors()[0]
    param = _loc(tuple(err["loc"])) or None
    msg = str(err["msg"]).removeprefix("Value error, ")
    where = f"invalid value for {param}: " if param else ""
    got = f" (got {err['input']!r})" if param and err["type"] != "missing" else ""
    return APIError(400, f"{where}{msg}{got}", param)


M = TypeVar("M", bound=BaseModel)


def parse_request(model: type[M], body: object) -> M:
    """Validate a decoded JSON body as `model`; APIError 400 naming the bad field."""
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


# ---------------------------------------------------------------------- requests
class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: bool = Field(default=False, description="Send a final chunk with usage.")
    continuous_usage_stats: bool = Field(
        default=False,
        description="With include_usage: every chunk carries the usage so far (as vLLM "
        "sends it), the final usage chunk too.",
    )


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = _REQUEST
    model: str = Field(description="Model name; must be the one this server serves.")
    temperature: float = Field(
        default=1.0, ge=0, le=2, description="Softmax temperature; 0 = greedy."
    )
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus probability mass.")
    n: int = Field(default=1, description="Choices per request; only 1 is supported.")
    stream: bool = Field(default=False, description="Stream the answer as server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="Streaming options.")
    stop: str | list[str] | None = Field(
        default=None,
        description=f"Up to {MAX_STOP_STRINGS} strings that end the output (excluded).",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SEED,
        description="Seed for reproducible sampling (0 to 2**64 - 1, torch's seed range).",
    )
    user: str | None = Field(default=None, description="End-user id (accepted and ignored).")
    top_k: int = Field(
        default=0, ge=-1, description="Extension: keep the k most likely tokens (0/-1: off)."
    )
    ignore_eos: bool = Field(default=False, description="Extension: do not stop at EOS tokens.")
    return_token_ids: bool = Field(
        default=False,
        description="Extension: each choice (each chunk's, when streaming) carries the ids "
        "of its generated tokens in `token_ids` (the exact sequence the server cached).",
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="Extension: token ids that end the output (the id is not shown)."
    )

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stop

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings as a tuple (empty when none)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every streamed chunk (`include_usage` and `continuous_usage_stats`)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """(alternatives per generated token, per prompt token) the request asks
        log-probabilities for; None: none asked."""
        return None, None


class CompletionRequest(SamplingRequest):
    """`POST /v1/completions`: one prompt (text or token ids)."""

    prompt: str | list[int] = Field(description="The prompt: a string or a list of token ids.")
    max_tokens: int | None = Field(
        default=DEFAULT_COMPLETION_MAX_TOKENS,
        ge=0,
        description="Most tokens to generate; 0 only with `echo` (the prompt's "
        "log-probabilities alone, as lm-evaluation-harness asks).",
    )
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LOGPROBS,
        description=f"Return each token's log-probability and the most likely this many "
        f"(0 to {MAX_LOGPROBS}) at its position.",
    )
    echo: bool = Field(
        default=False,
        description="Prepend the prompt to the text (and, with `logprobs`, its tokens' "
        "log-probabilities: null for the first).",
    )

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise APIError(
                400,
                "invalid value for max_tokens: Input should be greater than or equal to 1 "
                "(0 only with echo) (got 0)",
                "max_tokens",
            )
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return self.logprobs, (self.logprobs if self.echo else None)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: object) -> object:
        if isinstance(prompt, list) and any(isinstance(p, (str, list)) for p in prompt):
            raise ValueError("only one prompt per request (a string or a list of token ids)")
        if prompt == "" or prompt == []:
            raise ValueError("prompt is empty")
        return prompt


class TextPart(BaseModel):
    model_config = _REQUEST
    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str = Field(description="The text of this part.")


class ChatMessage(BaseModel):
    """One message of a conversation. `content` may be null only on an assistant message
    with `tool_calls`; a `tool` message answers one of them (`tool_call_id`)."""

    model_config = _REQUEST
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="Author of the message (`developer` is treated as `system`)."
    )
    content: str | list[TextPart] | None = Field(
        default=None, description="Text, or a list of text parts (null: only with tool_calls)."
    )
    tool_calls: list[ToolCallIn] | None = Field(
        default=None, description="An assistant message's tool calls."
    )
    tool_call_id: str | None = Field(
        default=None, description="A tool message: the id of the call it answers."
    )
    name: str | None = Field(default=None, description="Author name (accepted and ignored).")

    def check(self, where: str) -> None:
        """APIError 400 naming the field of this message (`where`: `messages[i]`) that
        breaks the shape rules of the class docstring."""
        if self.tool_calls is not None and self.role != "assistant":
            message = f"tool_calls are only allowed on assistant messages, not {self.role}"
            raise APIError(400, f"{where}.tool_calls: {message}", f"{where}.tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            message = "content is required (null only on an assistant message with tool_calls)"
            raise APIError(400, f"{where}.content: {message}", f"{where}.content")
        if self.role == "tool" and self.tool_call_id is None:
            message = "a tool message needs the tool_call_id of the call it answers"
            raise APIError(400, f"{where}.tool_call_id: {message}", f"{where}.tool_call_id")

    def text(self) -> str:
        """The content's text (parts joined; empty for null)."""
        if self.content is None:
            return ""
        return (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )

    def as_template_dict(self) -> dict[str, Any]:
        """The message for the chat template: `role` (`developer` as `system`) and
        `content` (text parts joined), with `tool_calls` (see `ToolCallIn`) and
        `tool_call_id` when it has them."""
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [call.as_template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(SamplingRequest):
    """`POST /v1/chat/completions`: a conversation rendered with the chat template."""

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Most tokens to generate (legacy)."
    )
    max_completion_tokens: int | None = Field(
        default=None, ge=1, description="Most tokens to generate (wins over max_tokens)."
    )
    logprobs: bool = Field(
        default=False, description="Return each generated token's log-probability."
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LOGPROBS,
        description=f"With `logprobs`: the most likely this many tokens (0 to {MAX_LOGPROBS}) "
        "at each position too.",
    )

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return top

    tools: list[ToolDef] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description=f"Functions the model may call (at "
        f"most {MAX_TOOLS}), rendered into the prompt by the chat template.",
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="`auto` (default with tools), `none`, `required` or a named function "
        "(the last two enforced by constrained decoding).",
    )
    parallel_tool_calls: bool = Field(
        default=True, description="With `required`: allow more than one call."
    )
    response_format: ResponseFormat | None = Field(
        default=None,
        description="`json_object` or `json_schema`: the reply is constrained to it.",
    )

    @model_validator(mode="after")
    def _tool_messages_answer_calls(self) -> ChatCompletionRequest:
        called: set[str] = set()
        for i, message in enumerate(self.messages):
            message.check(f"messages[{i}]")
            for call in message.tool_calls or ():
                called.add(call.id)
            if message.role == "tool" and message.tool_call_id not in called:
                raise APIError(
                    400,
                    f"messages[{i}].tool_call_id: {message.tool_call_id!r} answers no tool "
                    "call of an earlier assistant message",
                    f"messages[{i}].tool_call_id",
                )
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return ((self.top_logprobs or 0) if self.logprobs else None), None


def resolve_max_tokens(
    requested: int | None, default: int, max_position: int, param: str = "max_tokens"
) -> int:
    """The output budget: `requested` or `default`; APIError naming `param` when it exceeds
    the model's context limit `max_position`."""
    value = default if requested is None else requested
    if value > max_position:
        raise APIError(
            400, f"{param} must be <= the context limit {max_position}, got {value}", param
        )
    return value


def to_sampling_params(
    req: SamplingRequest,
    max_tokens: int,
    extra_stop_ids: tuple[int, ...] = (),
    grammar: str | None = None,
) -> SamplingParams:
    """The engine's sampling settings for a validated request (stop strings are handled by
    the ingress, see `SamplingRequest.stop_strings`); APIError 400 naming a bad value."""
    stop_ids = tuple(req.stop_token_ids or ()) + tuple(
        t for t in extra_stop_ids if t not in (req.stop_token_ids or ())
    )
    logprobs, prompt_logprobs = req.logprob_counts()
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            stop_token_ids=stop_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            grammar=grammar,
        )
    except ValueError as exc:
        param = str(exc).split(" ", 1)[0]
        raise APIError(400, str(exc), param if param in type(req).model_fields else None) from None
