"""``snapcell mcp``: the ``run_code`` tool served over the Model Context Protocol (stdio or streamable HTTP).

Built on the official ``mcp`` SDK (``pip install 'snapcell[mcp]'``). Each MCP session gets its own conversation
(its own persistent Python session) unless ``--conversation NAME`` pins one, which a desktop client uses to remember
across restarts: the conversation's head lives in the store's head store, so two server processes on the same store
continue the same session one after the other.

The SDK is imported only when a server is built, so the command line works without the extra.
"""

# No `from __future__ import annotations` here: the SDK reads the tool functions' annotations at runtime to find
# their Context parameter.

import argparse
import asyncio
import binascii
import contextlib
import functools
import hashlib
import importlib
import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Literal, TypeVar

from pydantic import Field

from snapcell.errors import ConfigError, SnapcellError
from snapcell.heads import validate_conversation_id
from snapcell.interpreter import Artifact
from snapcell.limits import Limits
from snapcell.policy import DEFAULT_MODULES, Policy
from snapcell.pool import AsyncPool
from snapcell.tool import CodeTool, RunCodeArguments, ToolArguments, ToolBool, ToolText
from snapcell.workspace import media_type

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = [
    "ENV",
    "MAX_ATTACHED_FILES",
    "MAX_CONTENT_BYTES",
    "McpSettings",
    "build_server",
    "load_tools",
    "refuse_requests",
    "run_command",
    "serve",
    "settings_from_args",
]

_A = TypeVar("_A", bound=ToolArguments)

# Environment variables read when the flag is absent: a desktop client's config usually sets the environment.
ENV = {
    "store": "SNAPCELL_STORE",
    "conversation": "SNAPCELL_CONVERSATION",
    "allow": "SNAPCELL_ALLOW",
    "tools": "SNAPCELL_TOOLS",
    "wall_time": "SNAPCELL_WALL_TIME",
    "memory": "SNAPCELL_MEMORY",
    "isolation": "SNAPCELL_ISOLATION",
}
DEFAULT_STORE = "file://.snapcell"
_INSTRUCTIONS = (
    "run_code runs Python in a persistent session: variables, functions and imports stay defined between calls, "
    "so keep data in variables and print only what you need to see."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class McpSettings:
    """How ``snapcell mcp`` runs.

    Attributes:
        store: Store URL or directory of the checkpoints and heads.
        conversation: Pin every MCP session to this conversation; None gives each MCP session its own.
        allow: Modules scripts may import besides the safe standard library (``numpy``, ``pandas``).
        tools: Host functions as ``module:attr`` (a function, or a mapping of names to functions).
        isolation: ``"process"`` (sandboxed workers, the default) or ``"inline"`` (no protection).
        limits: Limits of every run.
        max_answer_chars: Longest answer the model gets.
        transport: ``"stdio"`` or ``"http"`` (streamable HTTP).
        host: Address the HTTP transport listens on.
        port: Port the HTTP transport listens on.
        path: URL path of the HTTP endpoint.
        create_store: Make the local store's directory when it does not exist (the default store always is).
    """

    store: str = DEFAULT_STORE
    conversation: str | None = None
    allow: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    isolation: Literal["process", "inline"] = "process"
    limits: Limits = field(default_factory=Limits)
    max_answer_chars: int = 8000
    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    create_store: bool = False

    def __post_init__(self) -> None:
        if self.conversation is not None:
            validate_conversation_id(self.conversation)
        if self.transport not in ("stdio", "http"):
            raise ConfigError(f"transport must be 'stdio' or 'http', not {self.transport!r}")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer from 0 to 65535, not {self.port!r}")


def load_tools(specs: Sequence[str]) -> dict[str, Callable[..., Any]]:
    """Import host functions named ``module:attr``: a function (called by its attribute name) or a mapping of them.

    The current directory is importable, as for ``python -m``.

    Raises:
        ConfigError: A spec is malformed, its module cannot be imported, or it names neither a function nor a mapping.
    """
    tools: dict[str, Callable[..., Any]] = {}
    if specs and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"--tools takes module:attribute, like myapp.tools:TOOLS, not {spec!r}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"--tools {spec}: cannot import {module_name!r}: {exc}") from exc
        value: Any = module
        for part in attr.split("."):
            try:
                value = getattr(value, part)
            except AttributeError as exc:
                raise ConfigError(f"--tools {spec}: {module_name!r} has no attribute {attr!r}") from exc
        if isinstance(value, Mapping):
            tools.update(value)
        elif callable(value):
            tools[attr.rpartition(".")[2]] = value
        else:
            raise ConfigError(f"--tools {spec}: expected a function or a mapping of names to functions")
    return tools


class _Conversations:
    """Which conversation a tool call belongs to: the pinned one, else one per MCP session.

    Over stdio the server process serves one client connection, so it is one conversation. Over streamable HTTP a
    client that opened a session (the ``mcp-session-id`` header) gets one conversation per session; a request of
    the sessionless protocol belongs to no session and runs in a conversation of its own, and its answer says so.
    """

    def __init__(self, pinned: str | None) -> None:
        self._pinned = pinned
        self._process = "mcp-" + os.urandom(16).hex()

    def of(self, ctx: Any) -> tuple[str, str | None]:
        """The conversation of a call, and a note for the model when its state will not be kept."""
        if self._pinned is not None:
            return self._pinned, None
        headers = ctx.headers
        if headers is None:
            return self._process, None
        session_id = headers.get("mcp-session-id")
        if session_id:
            # The SDK routes a request only to a session it created, so the ID is the server's own.
            return "mcp-" + hashlib.sha256(session_id.encode()).hexdigest()[:32], None
        return "mcp-" + os.urandom(16).hex(), _NO_SESSION_NOTE


_NO_SESSION_NOTE = (
    "[note] this request came without an MCP session, so its variables are not kept for the next call; "
    "do everything in one call"
)


# What a client is sent beside a run's answer: the files the run wrote under out/, images as images (the types
# clients render) and the rest as embedded resources, at most this many and this many bytes together; the answer's
# [files] line names them all, and read_file fetches one that was left out.
_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_ATTACHED_FILES = 10
MAX_CONTENT_BYTES = 4 * 2**20


class _WriteFileArguments(ToolArguments):
    tool_name: ClassVar[str] = "write_file"

    path: ToolText = Field(description="Path relative to the workspace, e.g. 'data/input.csv'.")
    content: ToolText = Field(description="The file's text (UTF-8), or base64 when base64 is true.")
    base64: ToolBool = Field(default=False, description="True when content is base64 (binary files).")


class _ReadFileArguments(ToolArguments):
    tool_name: ClassVar[str] = "read_file"

    path: ToolText = Field(description="Path relative to the workspace, e.g. 'out/report.txt'.")


class _ListFilesArguments(ToolArguments):
    tool_name: ClassVar[str] = "list_files"


def build_server(tool: CodeTool, *, conversation: str | None = None) -> "MCPServer":
    """An MCP server exposing ``tool`` as ``run_code``; each MCP session is a conversation unless one is pinned.

    A run that failed (an error, a refused import, a time limit, a lost worker, a state not saved) is a tool result
    with ``isError`` set and the answer's usual text; the files it wrote under ``out/`` follow the text as image or
    resource content. Failures the application must fix (storage, keys, another turn holding the conversation) and
    arguments that do not fit the tool's schema are tool errors in plain words.
    """
    from snapcell import __version__

    try:
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.types import CallToolResult, TextContent, ToolAnnotations
    except ImportError as exc:
        raise ConfigError(f"snapcell mcp needs the MCP SDK ({exc}): pip install 'snapcell[mcp]'") from exc

    conversations = _Conversations(conversation)

    async def run_code(arguments: dict[str, Any], ctx: Context) -> CallToolResult:
        call = _checked(RunCodeArguments, arguments, ToolError)
        conversation, note = conversations.of(ctx)
        try:
            answer = await tool.run_turn(conversation, call.code, call.setup)
        except SnapcellError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        text = answer.text if note is None else f"{answer.text}\n{note}"
        return CallToolResult(content=[TextContent(text=text), *_attached(answer.files)], is_error=answer.failed)

    policy = tool.pool.policy
    offline = policy.restricted and not policy.modules - DEFAULT_MODULES
    annotations = ToolAnnotations(
        title="Run Python",
        read_only_hint=False,
        destructive_hint=True,  # it may rebind variables and delete files
        idempotent_hint=False,
        open_world_hint=bool(tool.tools) or not offline,  # host functions and allowed modules may reach out
    )
    tools = [_sdk_tool(run_code, RunCodeArguments, tool.name, tool.description, annotations)]
    if tool.pool.isolation == "process":  # only workers have a workspace
        tools += _file_tools(tool, conversations, ToolError)
    return MCPServer(name="snapcell", version=__version__, instructions=_INSTRUCTIONS, tools=tools)


def _sdk_tool(
    func: Callable[..., Any], arguments: type[ToolArguments], name: str, description: str, annotations: Any
) -> Any:
    """The SDK's tool for ``func``, with ``arguments``' schema; ``func`` gets the client's arguments unchecked.

    The SDK would derive a schema of its own from ``func``'s signature and answer a call that does not fit it with
    pydantic's report; here ``arguments`` is both the schema and the check (`_checked`), as for every other client.
    """
    from mcp.server.mcpserver.tools import Tool
    from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata

    tool = Tool.from_function(
        func, name=name, description=description, annotations=annotations, structured_output=False
    )
    tool.parameters = arguments.input_schema()
    tool.fn_metadata = FuncMetadata(arg_model=_unchecked_arguments())
    return tool


@functools.cache
def _unchecked_arguments() -> type[Any]:
    """The SDK's argument model that takes any object and hands it on whole, as ``arguments``."""
    from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
    from pydantic import ConfigDict

    class Unchecked(ArgModelBase):
        model_config = ConfigDict(extra="allow")

        def model_dump_one_level(self) -> dict[str, Any]:
            return {"arguments": dict(self.model_extra or {})}

    return Unchecked


def _checked(arguments: type[_A], data: dict[str, Any], tool_error: type[Exception]) -> _A:
    """``data`` checked against ``arguments``; a call that does not fit is a tool error in plain words."""
    try:
        return arguments.from_call(data)
    except ConfigError as exc:
        raise tool_error(str(exc)) from exc


def _attached(files: Sequence[Artifact]) -> list[Any]:
    """The content blocks of the files a run wrote: images, then other files as resources, within the bounds."""
    from mcp.types import TextContent

    blocks: list[Any] = []
    left_out: list[str] = []
    budget = MAX_CONTENT_BYTES
    # The media type from the path, here: the one a worker reports is its own word.
    typed = sorted(((media_type(f.path), f) for f in files), key=lambda pair: pair[0] not in _IMAGE_TYPES)
    for kind, artifact in typed:  # images first
        data = artifact.data
        if data is None or len(data) > budget or len(blocks) >= MAX_ATTACHED_FILES:
            left_out.append(artifact.path)
            continue
        budget -= len(data)
        blocks.append(_file_content(artifact.path, kind, data))
    if left_out:
        # Paths are checked on the host already; escaping what is shown keeps one on one line.
        shown = ", ".join(p if p.isprintable() else p.encode("unicode_escape").decode("ascii") for p in left_out[:20])
        more = f" and {len(left_out) - 20} more" if len(left_out) > 20 else ""
        limits = f"at most {MAX_ATTACHED_FILES} files and {MAX_CONTENT_BYTES // 2**20} MiB are attached"
        blocks.append(TextContent(text=f"[files] not attached ({limits}): {shown}{more}; read_file reads one"))
    return blocks


def _file_content(path: str, kind: str, data: bytes) -> Any:
    """A file as MCP content: an image a client can show, or an embedded resource (text, or base64 bytes)."""
    from mcp.types import BlobResourceContents, EmbeddedResource, ImageContent, TextResourceContents

    encoded = binascii.b2a_base64(data, newline=False).decode("ascii")
    if kind in _IMAGE_TYPES:
        return ImageContent(data=encoded, mime_type=kind)
    uri = "snapcell://workspace/" + urllib.parse.quote(path)
    text = _utf8(data)
    if text is not None:
        return EmbeddedResource(resource=TextResourceContents(uri=uri, mime_type=kind, text=text))
    return EmbeddedResource(resource=BlobResourceContents(uri=uri, mime_type=kind, blob=encoded))


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _file_tools(tool: CodeTool, conversations: _Conversations, tool_error: type[Exception]) -> list[Any]:
    """The workspace as MCP tools: write, read and list the files ``run_code`` sees in its working directory."""
    from mcp.server.mcpserver import Context
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

    async def write_file(arguments: dict[str, Any], ctx: Context) -> str:
        call = _checked(_WriteFileArguments, arguments, tool_error)
        conversation, _ = conversations.of(ctx)
        try:
            data = binascii.a2b_base64(call.content, strict_mode=True) if call.base64 else call.content.encode()
            await tool.put_file(conversation, call.path, data)
        except binascii.Error as exc:
            raise tool_error(f"content is not valid base64: {exc}") from exc
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        return f"wrote {call.path} ({len(data):,} bytes); run_code sees it in its working directory"

    async def read_file(arguments: dict[str, Any], ctx: Context) -> CallToolResult:
        call = _checked(_ReadFileArguments, arguments, tool_error)
        conversation, _ = conversations.of(ctx)
        try:
            data = await tool.get_file(conversation, call.path)
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        kind = media_type(call.path)
        text = _utf8(data) if kind not in _IMAGE_TYPES else None
        if text is not None:
            return CallToolResult(content=[TextContent(text=text)])
        if len(data) > MAX_CONTENT_BYTES:
            raise tool_error(
                f"{call.path} is a binary file of {len(data):,} bytes, more than the {MAX_CONTENT_BYTES // 2**20} MiB "
                "read_file sends; have run_code summarize or shrink it"
            )
        described = TextContent(text=f"{call.path}: a binary file of {len(data):,} bytes ({kind})")
        return CallToolResult(content=[described, _file_content(call.path, kind, data)])

    async def list_files(arguments: dict[str, Any], ctx: Context) -> str:
        _checked(_ListFilesArguments, arguments, tool_error)
        conversation, _ = conversations.of(ctx)
        try:
            files = await tool.list_files(conversation)
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        lines = [f"{f.path}\t{f.size_bytes:,} bytes\t{f.media_type}" for f in files]
        return "\n".join(lines) if lines else "(no files)"

    # Reading and listing change nothing (the head does not move); writing the same file twice leaves the same state.
    reading = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    return [
        _sdk_tool(
            write_file,
            _WriteFileArguments,
            "write_file",
            "Write a file into the Python session's workspace (its working directory), kept across calls.",
            ToolAnnotations(
                title="Write a workspace file",
                read_only_hint=False,
                destructive_hint=True,  # it replaces a file at the path
                idempotent_hint=True,
                open_world_hint=False,
            ),
        ),
        _sdk_tool(
            read_file,
            _ReadFileArguments,
            "read_file",
            "Read a file from the Python session's workspace (text; images and other binary files as their bytes).",
            reading.model_copy(update={"title": "Read a workspace file"}),
        ),
        _sdk_tool(
            list_files,
            _ListFilesArguments,
            "list_files",
            "List the files in the Python session's workspace, with sizes and media types.",
            reading.model_copy(update={"title": "List the workspace files"}),
        ),
    ]


async def serve(settings: McpSettings) -> None:
    """Open the pool and serve until the client goes away (stdio) or the process is stopped (HTTP).

    Raises:
        ConfigError: A setting is invalid or a tools module cannot be loaded; nothing was served.
        SnapcellError: The store or the pool could not be opened; nothing was served.
    """
    failure = await _serve(settings)
    if failure is not None:
        raise failure


async def _serve(settings: McpSettings) -> SnapcellError | None:
    """Serve as `serve` does; return the error that kept the server from starting (nothing was served then)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            policy = Policy().with_modules(settings.allow) if settings.allow else Policy()
            tools = load_tools(settings.tools)
            create = settings.create_store or settings.store == DEFAULT_STORE  # the default cannot be a mistyped path
            pool = AsyncPool(
                settings.store, policy=policy, limits=settings.limits, isolation=settings.isolation, create_store=create
            )
            await stack.enter_async_context(pool)
            tool = CodeTool(pool, tools=tools, max_answer_chars=settings.max_answer_chars)
            stack.push_async_callback(tool.aclose)
            server = build_server(tool, conversation=settings.conversation)
        except SnapcellError as exc:
            return exc
        if settings.transport == "stdio":
            await server.run_stdio_async()
        else:
            await server.run_streamable_http_async(
                host=settings.host, port=settings.port, streamable_http_path=settings.path
            )
    return None


def run_command(args: argparse.Namespace) -> int:
    """Run ``snapcell mcp`` from its parsed command line; return the exit code.

    A server that cannot start says why on stderr and, over stdio, also to the client: it answers the client's
    requests with the reason as a JSON-RPC error until the client hangs up, so the client shows the cause rather
    than "connection closed". (Over HTTP nothing listens, so stderr is the only place.)
    """
    try:
        settings = settings_from_args(args)
    except SnapcellError as exc:
        return _not_started(exc, stdio=args.transport == "stdio")
    failure = asyncio.run(_serve(settings))
    return 0 if failure is None else _not_started(failure, stdio=settings.transport == "stdio")


def _not_started(exc: SnapcellError, *, stdio: bool) -> int:
    """Report a server that could not start; the exit code."""
    reason = f"{type(exc).__name__}: {exc}"
    print(f"snapcell: {reason}", file=sys.stderr, flush=True)
    if stdio and not sys.stdin.isatty():  # a person at a terminal has read it on stderr already
        refuse_requests(f"snapcell mcp could not start: {reason}", sys.stdin.buffer, sys.stdout.buffer)
    return 1


# A client that is refused hangs up after a few requests (a probe, then the handshake); input is read no further.
_MAX_REFUSAL_LINES = 100
_MAX_LINE_BYTES = 1 << 20
_INTERNAL_ERROR = -32603  # JSON-RPC's code for an error inside the server


def refuse_requests(reason: str, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer every JSON-RPC request on ``stdin`` with an error carrying ``reason``, until the client hangs up.

    Plain JSON-RPC over newline-delimited JSON (MCP's stdio framing), without the SDK: the reason may be that the
    SDK is missing. A client probes (``server/discover``) and falls back to the handshake (``initialize``), so
    each request gets the reason. Notifications and lines that are not JSON are skipped; at most
    `_MAX_REFUSAL_LINES` lines are read.
    """
    for _ in range(_MAX_REFUSAL_LINES):
        line = stdin.readline(_MAX_LINE_BYTES)
        if not line:
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(message, dict) and "method" in message and message.get("id") is not None:
            error = {"code": _INTERNAL_ERROR, "message": reason}
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
            try:
                stdout.write(json.dumps(reply).encode() + b"\n")
                stdout.flush()
            except (BrokenPipeError, ValueError):  # the client is gone
                return


def settings_from_args(args: argparse.Namespace) -> McpSettings:
    """The settings of ``snapcell mcp``: each flag, else its environment variable (`ENV`), else the default.

    Raises:
        ConfigError: A value is malformed.
    """
    from snapcell.cli._storage import parse_duration, parse_size

    def pick(name: str) -> str | None:
        value: str | None = getattr(args, name)
        return value if value is not None else os.environ.get(ENV[name]) or None

    wall_time, memory = pick("wall_time"), pick("memory")
    limits = Limits(
        wall_time_s=parse_duration(wall_time) if wall_time else Limits().wall_time_s,
        memory_bytes=parse_size(memory) if memory else Limits().memory_bytes,
    )
    allow = tuple(m.strip() for m in (pick("allow") or "").split(",") if m.strip())
    tools = tuple(args.tools) if args.tools else tuple(t.strip() for t in (pick("tools") or "").split(",") if t.strip())
    isolation = pick("isolation") or "process"
    if isolation not in ("process", "inline"):
        raise ConfigError(f"isolation must be 'process' or 'inline', not {isolation!r}")
    return McpSettings(
        store=pick("store") or DEFAULT_STORE,
        conversation=pick("conversation"),
        allow=allow,
        tools=tools,
        isolation=isolation,  # type: ignore[arg-type]  # checked just above
        limits=limits,
        max_answer_chars=args.max_answer_chars,
        transport=args.transport,
        host=args.host,
        port=args.port,
        path=args.path,
        create_store=args.create,
    )


def add_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]", run: Callable[..., int]) -> None:
    """Register ``snapcell mcp`` on the CLI's subparsers; ``run`` is what the parsed command calls."""
    p = commands.add_parser(
        "mcp",
        help="serve the run_code tool over MCP (stdio or streamable HTTP)",
        description="Serve the run_code tool to an MCP client. Each MCP session gets its own persistent Python "
        "session, unless --conversation pins one (a desktop client that should remember across restarts). Every "
        "option can also come from the environment variable named in its help. Needs pip install 'snapcell[mcp]'.",
    )
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="stdio (default) or streamable HTTP")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the HTTP transport listens on (127.0.0.1); it has no authentication, so keep it private",
    )
    p.add_argument("--port", type=int, default=8000, help="port of the HTTP transport (8000)")
    p.add_argument("--path", default="/mcp", help="URL path of the HTTP endpoint (/mcp)")
    p.add_argument("--store", default=None, help=f"store URL or directory (${ENV['store']}, default {DEFAULT_STORE})")
    p.add_argument("--create", action="store_true", help="make the store's directory if it does not exist")
    p.add_argument(
        "--conversation", default=None, help=f"one conversation for every MCP session (${ENV['conversation']})"
    )
    p.add_argument(
        "--allow", default=None, metavar="MODULES", help=f"modules to allow, like numpy,pandas (${ENV['allow']})"
    )
    p.add_argument(
        "--tools",
        action="append",
        metavar="MODULE:ATTR",
        help=f"host functions: a function or a dict of them (repeatable; ${ENV['tools']}, comma-separated)",
    )
    p.add_argument(
        "--wall-time", default=None, metavar="DURATION", help=f"time limit of a run, like 30s (${ENV['wall_time']})"
    )
    p.add_argument("--memory", default=None, metavar="SIZE", help=f"memory of a session, like 2GiB (${ENV['memory']})")
    p.add_argument(
        "--isolation",
        choices=("process", "inline"),
        default=None,
        help=f"process (default): sandboxed workers; inline: this process, no protection (${ENV['isolation']})",
    )
    p.add_argument("--max-answer-chars", type=int, default=8000, help="longest answer (8000)")
    p.set_defaults(func=run)
