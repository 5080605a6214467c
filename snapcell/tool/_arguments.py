"""A tool's arguments as one pydantic model: the JSON schema a model is given, and the check of what it sent.

`RunCodeArguments` is the ``run_code`` tool's: `CodeTool.json_schema`, `tool_call_arguments`, the MCP server and
the framework adapters all use it, so the schema a model reads and the check its call meets cannot drift apart.
A call that does not fit is refused with a `ConfigError` in plain words the model can act on, never pydantic's
own report (error codes, a documentation link).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError
from pydantic_core import ErrorDetails

from snapcell.errors import ConfigError

__all__ = ["RunCodeArguments", "ToolArguments", "ToolBool", "ToolText", "tool_call_arguments"]


def _quoted_bool(value: object) -> object:
    """``"true"``/``"false"`` (any case, spaces around) as the boolean: some models quote booleans."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


# Strict: pydantic's lax rules would take 1, "yes" or "off" for a boolean and bytes for text; a model that sends
# those meant something else, and is told so.
ToolBool = Annotated[bool, BeforeValidator(_quoted_bool), Strict()]
ToolText = Annotated[str, Strict()]

# What each JSON type is called in an error message.
_EXPECTED = {"string": "a string", "boolean": "true or false", "integer": "a whole number", "number": "a number"}
_NOT_AN_OBJECT = {"model_type", "model_attributes_type", "dict_type"}


def _tool_schema(schema: dict[str, Any]) -> None:
    """Trim pydantic's schema to what a model reads: no titles, no class docstring; other keys are refused."""
    schema.pop("title", None)
    schema.pop("description", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False


class ToolArguments(BaseModel):
    """Base of a tool's arguments: subclasses declare the fields (with descriptions) and ``tool_name``.

    Keys a call sends that the model does not declare are ignored (the schema asks for none), so a model's stray
    extra key does not fail an otherwise good call.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", json_schema_extra=_tool_schema)

    tool_name: ClassVar[str] = "the tool"

    @classmethod
    def input_schema(cls) -> dict[str, Any]:
        """The JSON schema of the arguments (a new dict each call), without titles; the description goes beside it."""
        return cls.model_json_schema()

    @classmethod
    def from_call(cls, arguments: str | bytes | Mapping[str, Any]) -> Self:
        """Check a model's tool-call arguments (JSON text or a mapping) against the model.

        Raises:
            ConfigError: The arguments are not a JSON object, lack a required argument, or one has the wrong type;
                the message says which, in plain words.
        """
        if isinstance(arguments, str | bytes):
            try:
                data: object = json.loads(arguments)
            except (ValueError, RecursionError) as exc:
                raise ConfigError(f"{cls.tool_name} arguments are not valid JSON: {exc}") from exc
        else:
            data = arguments
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(cls._plain(exc)) from exc

    @classmethod
    def _plain(cls, error: ValidationError) -> str:
        """What is wrong with the arguments, one clause per problem (pydantic's report is for programmers)."""
        properties = cls.model_json_schema().get("properties", {})
        problems = [cls._problem(detail, properties) for detail in error.errors(include_url=False)]
        return "; ".join(dict.fromkeys(problems))

    @classmethod
    def _problem(cls, detail: ErrorDetails, properties: Mapping[str, Any]) -> str:
        name = str(detail["loc"][0]) if detail["loc"] else None
        if name is None or detail["type"] in _NOT_AN_OBJECT:
            example = ", ".join(f'"{key}": ...' for key in cls.model_json_schema().get("required", ()))
            return f"{cls.tool_name} arguments must be a JSON object like {{{example}}}, not {_shown(detail['input'])}"
        prop = properties.get(name, {})
        if detail["type"] == "missing":
            about = prop.get("description", "")
            return f"{cls.tool_name} needs the argument {name!r}" + (f" ({about.rstrip('.')})" if about else "")
        expected = _EXPECTED.get(prop.get("type", ""), "of another type")
        return f"{cls.tool_name} argument {name!r} must be {expected}, not {_shown(detail['input'])}"


def _shown(value: object) -> str:
    """A short JSON-like rendering of a value a model sent."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):  # not JSON: passed as a Python object
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class RunCodeArguments(ToolArguments):
    """The arguments of the ``run_code`` tool.

    Attributes:
        code: The model's script.
        setup: Whether the script is a setup cell (rerun after a restart); a JSON boolean or its text.
    """

    tool_name: ClassVar[str] = "run_code"

    code: ToolText = Field(description="Python code to run; the value of its last expression is shown.")
    setup: ToolBool = Field(
        default=False,
        description="True for setup code (imports, loading data) that should run again if the session ever restarts.",
    )


def tool_call_arguments(arguments: str | bytes | Mapping[str, Any]) -> tuple[str, bool]:
    """Parse a model's ``run_code`` call arguments (JSON text or a dict) into ``(code, setup)``; see `RunCodeArguments`.

    ``setup`` may be a JSON boolean or the text ``"true"``/``"false"`` (some models quote booleans); it defaults
    to false.

    Raises:
        ConfigError: The arguments are not an object with a string ``code``, or ``setup`` is not a boolean.
    """
    checked = RunCodeArguments.from_call(arguments)
    return checked.code, checked.setup
