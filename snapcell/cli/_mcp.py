"""``snapcell mcp``: the ``run_code`` tool served over the Model Context Protocol (stdio or streamable HTTP).

Built on the official ``mcp`` SDK (``pip install 'snapcell[mcp]'``). Each MCP session gets its own conversation
(its own persistent Python session) unless ``--conversation NAME`` pins one, which a desktop client uses to remember
across restarts: the conversation's head lives in the store's head store, so two server processes on the same store
continue the same session one after the other.

The SDK is imported only when a server is built, so the command line works without the extra.
"""

# No `from __future__ import annotations` here: the SDK reads the tool function's annotations at runtime to find
# its Context parameter and build the input schema.

import argparse
import binascii
import hashlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from snapcell.errors import ConfigError, SnapcellError
from snapcell.heads import validate_conversation_id
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.pool import AsyncPool
from snapcell.tool import CodeTool

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = ["ENV", "McpSettings", "build_server", "load_tools", "serve", "settings_from_args"]

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


def build_server(tool: CodeTool, *, conversation: str | None = None) -> "MCPServer":
    """An MCP server exposing ``tool`` as ``run_code``; each MCP session is a conversation unless one is pinned.

    Failures the application must fix (storage, keys, another turn holding the conversation) come back as tool
    errors with their snapcell error type; script errors are part of the answer text, as for any turn.
    """
    from snapcell import __version__

    try:
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError as exc:
        raise ConfigError(f"snapcell mcp needs the MCP SDK ({exc}): pip install 'snapcell[mcp]'") from exc

    server: MCPServer = MCPServer(name="snapcell", version=__version__, instructions=_INSTRUCTIONS)
    conversations = _Conversations(conversation)

    async def run_code(
        code: Annotated[str, Field(description="Python code to run; the value of its last expression is shown.")],
        ctx: Context,
        setup: Annotated[
            bool,
            Field(
                description="True for setup code (imports, loading data) that should run again if the session "
                "ever restarts."
            ),
        ] = False,
    ) -> str:
        conversation, note = conversations.of(ctx)
        try:
            answer = await tool.run_code(conversation, code, setup)
        except SnapcellError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        return answer if note is None else f"{answer}\n{note}"

    server.add_tool(run_code, name=tool.name, description=tool.description, structured_output=False)
    if tool.pool.isolation == "process":  # only workers have a workspace
        _add_file_tools(server, tool, conversations, ToolError)
    return server


def _add_file_tools(server: Any, tool: CodeTool, conversations: _Conversations, tool_error: type[Exception]) -> None:
    """The workspace as MCP tools: write, read and list the files ``run_code`` sees in its working directory."""
    from mcp.server.mcpserver import Context

    async def write_file(
        path: Annotated[str, Field(description="Path relative to the workspace, e.g. 'data/input.csv'.")],
        content: Annotated[str, Field(description="The file's text (UTF-8), or base64 when base64 is true.")],
        ctx: Context,
        base64: Annotated[bool, Field(description="True when content is base64 (binary files).")] = False,
    ) -> str:
        conversation, _ = conversations.of(ctx)
        try:
            data = binascii.a2b_base64(content, strict_mode=True) if base64 else content.encode()
            await tool.put_file(conversation, path, data)
        except binascii.Error as exc:
            raise tool_error(f"content is not valid base64: {exc}") from exc
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        return f"wrote {path} ({len(data):,} bytes); run_code sees it in its working directory"

    async def read_file(
        path: Annotated[str, Field(description="Path relative to the workspace, e.g. 'out/report.txt'.")],
        ctx: Context,
    ) -> str:
        conversation, _ = conversations.of(ctx)
        try:
            data = await tool.get_file(conversation, path)
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        try:
            return data.decode()
        except UnicodeDecodeError:
            return f"[base64 of a binary file of {len(data):,} bytes]\n" + binascii.b2a_base64(data).decode()

    async def list_files(ctx: Context) -> str:
        conversation, _ = conversations.of(ctx)
        try:
            files = await tool.list_files(conversation)
        except SnapcellError as exc:
            raise tool_error(f"{type(exc).__name__}: {exc}") from exc
        lines = [f"{f.path}\t{f.size_bytes:,} bytes\t{f.media_type}" for f in files]
        return "\n".join(lines) if lines else "(no files)"

    for func, text in (
        (write_file, "Write a file into the Python session's workspace (its working directory), kept across calls."),
        (read_file, "Read a file from the Python session's workspace (text, or base64 for binary files)."),
        (list_files, "List the files in the Python session's workspace, with sizes and media types."),
    ):
        server.add_tool(func, name=func.__name__, description=text, structured_output=False)


async def serve(settings: McpSettings) -> None:
    """Open the pool and serve until the client goes away (stdio) or the process is stopped (HTTP).

    Raises:
        ConfigError: A setting is invalid or a tools module cannot be loaded; nothing was served.
    """
    policy = Policy().with_modules(settings.allow) if settings.allow else Policy()
    tools = load_tools(settings.tools)
    create = settings.create_store or settings.store == DEFAULT_STORE  # the default cannot be a mistyped path
    pool = AsyncPool(
        settings.store, policy=policy, limits=settings.limits, isolation=settings.isolation, create_store=create
    )
    async with pool:
        tool = CodeTool(pool, tools=tools, max_answer_chars=settings.max_answer_chars)
        try:
            server = build_server(tool, conversation=settings.conversation)
            if settings.transport == "stdio":
                await server.run_stdio_async()
            else:
                await server.run_streamable_http_async(
                    host=settings.host, port=settings.port, streamable_http_path=settings.path
                )
        finally:
            await tool.aclose()


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
        "--wall-time", default=None, metavar="DURATION", help=f"time limit of a run, like 30s ({ENV['wall_time']})"
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
