"""The OpenAI request fields of tool calling and structured outputs: `tools`,
`tool_choice`, assistant `tool_calls` and `response_format` (validated strictly like
every request field; see `openai_protocol`).

Bounds (a 400 naming the value past them): at most `MAX_TOOLS` tools, function names of
OpenAI's form (`NAME_PATTERN`), and each JSON schema (a tool's `parameters`, a
`json_schema`'s `schema`) at most `MAX_SCHEMA_BYTES` as JSON.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOOLS = 128
MAX_SCHEMA_BYTES = 32_768
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

_STRICT = ConfigDict(extra="ignore", strict=True)


def _bounded_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if schema is not None:
        size = len(json.dumps(schema))
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES}")
    return schema


class FunctionDef(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN, description="The function's name.")
    description: str | None = Field(default=None, description="What it does (for the model).")
    parameters: dict[str, Any] | None = Field(
        default=None, description="JSON schema of its arguments (None: any object)."
    )
    strict: bool | None = Field(default=None, description="Accepted; schemas are always kept.")

    _schema = field_validator("parameters")(_bounded_schema)

    def argument_schema(self) -> dict[str, Any]:
        """The schema its arguments must satisfy (an object when none is given)."""
        return self.parameters if self.parameters is not None else {"type": "object"}


class ToolDef(BaseModel):
    model_config = _STRICT
    type: Literal["function"] = Field(description="Only function tools are supported.")
    function: FunctionDef = Field(description="The function.")


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str = Field(description="The function that must be called.")


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"] = Field(description="Always function.")
    function: NamedFunction = Field(description="The function to call.")


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = _STRICT
    name: str = Field(description="The function called.")
    arguments: str = Field(description="Its arguments, as a JSON string.")


class ToolCallIn(BaseModel):
    """An assistant message's tool call, as the client sends its history back."""

    model_config = _STRICT
    id: str = Field(min_length=1, description="The call's id (tool messages answer it).")
    type: Literal["function"] = Field(description="Always function.")
    function: CalledFunction = Field(description="The call.")

    def as_template_dict(self) -> dict[str, Any]:
        """The call for a chat template: its arguments as an object when they parse as
        one (templates render them with `tojson`), else the string as sent."""
        arguments: Any = self.function.arguments
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
        function = {"name": self.function.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


class JsonSchemaFormat(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN, description="The schema's name.")
    description: str | None = Field(default=None, description="What it is for.")
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON schema.")
    strict: bool | None = Field(default=None, description="Accepted; always enforced.")

    _schema = field_validator("schema_")(_bounded_schema)


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"] = Field(
        description="`text` (free), `json_object` (any JSON object) or `json_schema`."
    )
    json_schema: JsonSchemaFormat | None = Field(
        default=None, description="With `json_schema`: the schema the reply must satisfy."
    )

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema")
        return self
