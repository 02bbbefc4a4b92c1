"""Validation of OpenAI requests against the served model, before anything is planned:
`ServedModel` (name, tokenizer, limits) and `prepare_completion` / `prepare_chat`, which
turn a decoded JSON body into prompt token ids and `SamplingParams`, or raise `APIError`
(400 naming the bad value; 404 `model_not_found` for another model's name).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.hf.parse import parse_hf_config
from marconi_ray.protocol.generation_defaults import GenerationDefaults, read_generation_defaults
from marconi_ray.protocol.model_files import END_OF_TURN, load_tokenizer, read_config_json
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.validation import validate_prompt
from marconi_ray.serve.ingress.openai_protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    parse_request,
    resolve_max_tokens,
    to_sampling_params,
)
from marconi_ray.serve.ingress.tools.grammar import OutputError, OutputPlan, plan_output
from marconi_ray.serve.ingress.tools.hermes import HermesParser
from marconi_ray.serve.ingress.tools.parser import ToolParser
from marconi_ray.serve.ingress.tools.registry import parser_for


@dataclass(frozen=True)
class ServedModel:
    """What the ingress knows of the model: its name, tokenizer, limits and generation
    defaults.

    Attributes:
        chat_stop_ids: token ids that end an assistant turn (`<|end|>` when the tokenizer
            has it); chat requests stop at them unless `ignore_eos`.
        defaults: the checkpoint's generation defaults (`generation_config.json`, see
            `protocol.generation_defaults`): the sampling settings and output budget of a
            request that sets none, and the end-of-sequence ids every request stops at
            unless `ignore_eos`.
        created: Unix time shown in `/v1/models`.
        max_piece_chars: characters of the longest vocabulary entry (special ones too):
            no token stands for more characters of text, which bounds a text's token
            count from below without tokenizing it (`min_tokens`).
        tool_parser: reads tool calls out of the output (`tools.registry`: by the
            `tool_call_parser` setting, `auto` by the chat template).
    """

    name: str
    tokenizer: Any
    vocab_size: int
    max_position: int
    chat_stop_ids: tuple[int, ...]
    created: int
    max_piece_chars: int = 0
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    tool_parser: ToolParser = field(default_factory=HermesParser)

    @classmethod
    def load(cls, model_dir: str | Path, name: str, tool_call_parser: str = "auto") -> ServedModel:
        """Read the config, generation config, tokenizer and chat template of `model_dir`
        (offline); ValueError naming a `tool_call_parser` that is none of
        `tools.registry.SETTINGS`."""
        arch = parse_hf_config(read_config_json(model_dir))
        defaults = read_generation_defaults(model_dir, arch.vocab_size)
        tokenizer = load_tokenizer(model_dir)
        vocab = tokenizer.get_vocab()
        stops = (int(vocab[END_OF_TURN]),) if END_OF_TURN in vocab else ()
        longest = max((len(piece) for piece in vocab), default=1)
        created = int(time.time())
        template = getattr(tokenizer, "chat_template", None)
        parser = parser_for(tool_call_parser, template if isinstance(template, str) else None)
        return cls(
            name,
            tokenizer,
            arch.vocab_size,
            arch.context_limit,
            stops,
            created,
            longest,
            defaults,
            parser,
        )

    def min_tokens(self, texts: list[str]) -> int:
        """A lower bound of the tokens `texts` encode to, in O(characters) C-speed work:
        their non-blank characters over `2 * max_piece_chars` (blanks may be dropped by a
        pre-tokenizer; the factor 2 covers normalizers that merge characters). 0 when
        the vocabulary's pieces are unknown."""
        if self.max_piece_chars <= 0:
            return 0
        chars = sum(len(t) - t.count(" ") - t.count("\n") - t.count("\t") for t in texts)
        return chars // (2 * self.max_piece_chars)


@dataclass(frozen=True)
class Prepared:
    """A validated request, ready to plan."""

    prompt: npt.NDArray[np.int32]
    params: SamplingParams
    request: SamplingRequest
    output: OutputPlan = field(default_factory=OutputPlan)
    """How the output is constrained and read (chat: tools and `response_format`)."""


def _check_model(name: str, model: ServedModel) -> None:
    if name != model.name:
        message = f"model {name!r} does not exist; this server serves {model.name!r}"
        raise APIError(404, message, "model", "model_not_found")


def _too_long(param: str, tokens: str, model: ServedModel) -> APIError:
    return APIError(
        400,
        f"{param}: the prompt has {tokens} tokens; the context limit is {model.max_position} "
        "(prompt plus at least one generated token)",
        param,
        "context_length_exceeded",
    )


def _check_size(texts: list[str], model: ServedModel, param: str) -> None:
    """Refuse text that cannot fit before tokenizing it (see `ServedModel.min_tokens`)."""
    at_least = model.min_tokens(texts)
    if at_least >= model.max_position:
        raise _too_long(param, f"at least {at_least}", model)


def _check_prompt(ids: Any, model: ServedModel, param: str) -> npt.NDArray[np.int32]:
    n = len(ids)
    if n >= model.max_position:
        raise _too_long(param, str(n), model)
    try:
        return validate_prompt(ids, model.vocab_size, model.max_position)
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param) from None


def _check_text(text: str, param: str) -> None:
    """APIError 400 naming `param` for text that is not valid Unicode (a lone UTF-16
    surrogate, which JSON's `\\udXXX` escapes can carry): the tokenizer cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(
            400,
            f"{param}: contains a lone UTF-16 surrogate at position {exc.start}",
            param,
        ) from None


R = TypeVar("R", bound=SamplingRequest)


def _with_defaults(req: R, model: ServedModel) -> R:
    """`req` with the checkpoint's sampling defaults in the fields it does not set."""
    update = {k: v for k, v in model.defaults.sampling().items() if k not in req.model_fields_set}
    return req.model_copy(update=update) if update else req


def _stop_ids(req: SamplingRequest, extra: tuple[int, ...], model: ServedModel) -> tuple[int, ...]:
    """`extra` and the end-of-sequence ids, unless `ignore_eos`."""
    return () if req.ignore_eos else extra + model.defaults.eos_token_ids


def _params(
    req: SamplingRequest,
    max_tokens: int,
    model: ServedModel,
    extra: tuple[int, ...],
    grammar: str | None = None,
) -> SamplingParams:
    for t in req.stop_token_ids or ():
        if t >= model.vocab_size:
            raise APIError(
                400,
                f"stop_token_ids: token id {t} is outside the vocabulary [0, {model.vocab_size})",
                "stop_token_ids",
            )
    return to_sampling_params(req, max_tokens, extra, grammar)


def prepare_completion(body: object, model: ServedModel) -> Prepared:
    """Validate a `/v1/completions` body (APIError naming the bad value); settings it
    leaves out take the checkpoint's generation defaults (`ServedModel.defaults`)."""
    req = _with_defaults(parse_request(CompletionRequest, body), model)
    _check_model(req.model, model)
    if isinstance(req.prompt, str):
        _check_size([req.prompt], model, "prompt")
        _check_text(req.prompt, "prompt")
    ids = req.prompt if isinstance(req.prompt, list) else model.tokenizer.encode(req.prompt)
    prompt = _check_prompt(ids, model, "prompt")
    limit = model.max_position
    requested = req.max_tokens if "max_tokens" in req.model_fields_set else None
    default = model.defaults.budget(DEFAULT_COMPLETION_MAX_TOKENS)
    max_tokens = resolve_max_tokens(requested, default, limit)
    # max_tokens 0 (echo: the prompt's log-probabilities alone) samples one token that
    # the response leaves out (`CompletionFormat`)
    params = _params(req, max(1, max_tokens), model, _stop_ids(req, (), model))
    return Prepared(prompt, params, req)


def _render_chat(req: ChatCompletionRequest, model: ServedModel) -> list[int]:
    messages = [m.as_template_dict() for m in req.messages]
    texts = [m["content"] for m in messages]
    calls = [c["function"] for m in messages for c in m.get("tool_calls", ())]
    texts += [c["arguments"] for c in calls if isinstance(c["arguments"], str)]
    tools = None if req.tools is None else [t.model_dump(exclude_none=True) for t in req.tools]
    _check_size(texts + ([json.dumps(tools)] if tools else []), model, "messages")
    for i, message in enumerate(messages):
        _check_text(message["content"], f"messages[{i}].content")
    try:
        out = model.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # jinja errors, a missing template
        raise APIError(
            400, f"messages: cannot apply the chat template: {exc}", "messages"
        ) from None
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids]


def prepare_chat(body: object, model: ServedModel) -> Prepared:
    """Validate a `/v1/chat/completions` body; chat stops at the end-of-turn token unless
    `ignore_eos` (APIError naming the bad value); settings it leaves out take the
    checkpoint's generation defaults (`ServedModel.defaults`)."""
    req = _with_defaults(parse_request(ChatCompletionRequest, body), model)
    _check_model(req.model, model)
    prompt = _check_prompt(_render_chat(req, model), model, "messages")
    param = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    requested = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
    limit = model.max_position
    default = model.defaults.budget(limit - len(prompt))
    max_tokens = resolve_max_tokens(requested, default, limit, param)
    extra = _stop_ids(req, model.chat_stop_ids, model)
    try:
        output = plan_output(
            req.tools,
            req.tool_choice,
            req.parallel_tool_calls,
            req.response_format,
            model.tool_parser,
        )
    except OutputError as exc:
        raise APIError(400, str(exc), exc.param) from None
    params = _params(req, max_tokens, model, extra, output.grammar)
    return Prepared(prompt, params, req, output)
