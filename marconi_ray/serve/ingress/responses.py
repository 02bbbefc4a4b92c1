"""OpenAI response objects we emit: completions, chat completions, their streamed chunks,
usage with cached tokens, and the model list. Pydantic, a description on every field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens served from the prefix cache.")


class UsageInfo(BaseModel):
    prompt_tokens: int = Field(description="Tokens in the prompt.")
    completion_tokens: int = Field(description="Tokens generated.")
    total_tokens: int = Field(description="prompt_tokens + completion_tokens.")
    prompt_tokens_details: PromptTokensDetails = Field(description="Prompt token breakdown.")

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


class _TokenIdsExtension(BaseModel):
    """Drops `token_ids` from the JSON unless it was asked for (OpenAI's exact shape)."""

    @model_serializer(mode="wrap")
    def _omit_unrequested_ids(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("token_ids") is None:
            out.pop("token_ids", None)
        return out


class CompletionLogprobs(BaseModel):
    """Legacy completions' log-probabilities, one entry per token of the choice's text
    (the prompt's first when `echo`)."""

    tokens: list[str] = Field(description="Each token's text.")
    token_logprobs: list[float | None] = Field(
        description="Each token's log-probability (null for the prompt's first token)."
    )
    top_logprobs: list[dict[str, float] | None] = Field(
        description="The most likely tokens at each position, text -> log-probability "
        "(null for the prompt's first token)."
    )
    text_offset: list[int] = Field(description="Each token's character offset in the text.")


class TopLogprob(BaseModel):
    token: str = Field(description="The token's text.")
    logprob: float = Field(description="Its log-probability.")
    bytes: list[int] = Field(description="The UTF-8 bytes of `token`.")


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(
        description="The most likely tokens at this position, most likely first."
    )


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(description="One entry per generated token.")


class CompletionChoice(_TokenIdsExtension):
    index: int = Field(default=0, description="Choice index (always 0).")
    text: str = Field(description="Generated text (or this chunk's part of it).")
    finish_reason: str | None = Field(
        default=None, description="`stop`, `length`, or null mid-stream."
    )
    logprobs: CompletionLogprobs | None = Field(
        default=None, description="With `logprobs`: this choice's (or chunk's) tokens."
    )
    token_ids: list[int] | None = Field(
        default=None, description="Extension (`return_token_ids`): the generated token ids."
    )


class Completion(BaseModel):
    """A completion, or (with `finish_reason` null until the end) one streamed chunk."""

    id: str = Field(description="`cmpl-...`, the same for every chunk of a request.")
    object: Literal["text_completion"] = Field(
        default="text_completion", description="Object type."
    )
    created: int = Field(description="Unix time the request was received.")
    model: str = Field(description="The model that answered.")
    choices: list[CompletionChoice] = Field(description="One choice (none in a usage chunk).")
    usage: UsageInfo | None = Field(
        default=None, description="Token counts (final response/chunk)."
    )


class FunctionCall(BaseModel):
    name: str = Field(description="The function called.")
    arguments: str = Field(description="Its arguments, as a JSON string.")


class ToolCall(BaseModel):
    id: str = Field(description="`call_...`: what the tool message answering it names.")
    type: Literal["function"] = Field(default="function", description="Always function.")
    function: FunctionCall = Field(description="The call.")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = Field(default="assistant", description="Always assistant.")
    content: str | None = Field(description="The reply text (null: only tool calls).")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="The tool calls the reply makes (left out when none)."
    )

    @model_serializer(mode="wrap")
    def _omit_no_calls(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("tool_calls") is None:
            out.pop("tool_calls", None)
        return out


class ChatChoice(_TokenIdsExtension):
    index: int = Field(default=0, description="Choice index (always 0).")
    message: AssistantMessage = Field(description="The reply.")
    finish_reason: str | None = Field(description="`stop`, `length` or `tool_calls`.")
    logprobs: ChatLogprobs | None = Field(
        default=None, description="With `logprobs`: the reply's tokens."
    )
    token_ids: list[int] | None = Field(
        default=None, description="Extension (`return_token_ids`): the generated token ids."
    )


class ChatCompletion(BaseModel):
    id: str = Field(description="`chatcmpl-...`.")
    object: Literal["chat.completion"] = Field(
        default="chat.completion", description="Object type."
    )
    created: int = Field(description="Unix time the request was received.")
    model: str = Field(description="The model that answered.")
    choices: list[ChatChoice] = Field(description="One choice.")
    usage: UsageInfo = Field(description="Token counts.")


class FunctionDelta(BaseModel):
    name: str = Field(description="The function called.")
    arguments: str = Field(description="Its arguments (the whole JSON string).")


class ToolCallDelta(BaseModel):
    """A tool call in a streamed chunk: each call comes whole, in the chunk whose text
    completes it (a client concatenating `arguments` by `index` gets the same)."""

    index: int = Field(description="The call's position among the reply's calls.")
    id: str = Field(description="`call_...`.")
    type: Literal["function"] = Field(default="function", description="Always function.")
    function: FunctionDelta = Field(description="The call.")


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(
        default=None, description="Set on the first chunk only."
    )
    content: str | None = Field(default=None, description="New text in this chunk.")
    tool_calls: list[ToolCallDelta] | None = Field(
        default=None, description="Tool calls completed in this chunk."
    )

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(_TokenIdsExtension):
    index: int = Field(default=0, description="Choice index (always 0).")
    delta: ChatDelta = Field(description="What this chunk adds.")
    finish_reason: str | None = Field(default=None, description="Set on the last content chunk.")
    logprobs: ChatLogprobs | None = Field(
        default=None, description="With `logprobs`: this chunk's tokens."
    )
    token_ids: list[int] | None = Field(
        default=None, description="Extension (`return_token_ids`): this chunk's token ids."
    )


class ChatCompletionChunk(BaseModel):
    id: str = Field(description="`chatcmpl-...`, the same for every chunk of a request.")
    object: Literal["chat.completion.chunk"] = Field(
        default="chat.completion.chunk", description="Object type."
    )
    created: int = Field(description="Unix time the request was received.")
    model: str = Field(description="The model that answered.")
    choices: list[ChatChunkChoice] = Field(description="One choice (none in a usage chunk).")
    usage: UsageInfo | None = Field(
        default=None, description="Token counts (final usage chunk only)."
    )


class ModelCard(BaseModel):
    id: str = Field(description="The model name clients pass as `model`.")
    object: Literal["model"] = Field(default="model", description="Object type.")
    created: int = Field(description="Unix time the server started.")
    owned_by: str = Field(default="marconi-ray", description="Owner shown to clients.")


class ModelList(BaseModel):
    object: Literal["list"] = Field(default="list", description="Object type.")
    data: list[ModelCard] = Field(description="The served models (one).")
