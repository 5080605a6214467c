"""``snapcell mcp`` end to end, driven by the MCP SDK's own client over stdio and streamable HTTP."""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, EmbeddedResource, ImageContent

from snapcell import AsyncPool, CodeTool, Limits
from snapcell.cli import build_parser
from snapcell.cli._mcp import (
    ENV,
    MAX_ATTACHED_FILES,
    MAX_CONTENT_BYTES,
    _attached,
    build_server,
    load_tools,
    run_command,
    settings_from_args,
)
from snapcell.errors import ConfigError
from snapcell.interpreter import Artifact

HOST_MODULE = '''
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    if amount > 100:
        raise ConnectionError("the payment gateway refused the connection")
    return f"charged {amount}"

TOOLS = {"charge_card": charge_card}
'''


def _server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    """A stdio server process in ``tmp_path`` (its store in ``tmp_path / "store"``)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCELL_")}
    environment.update(env or {})
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "snapcell", "mcp", "--store", f"file://{tmp_path / 'store'}", "--create", *args],
        env=environment,
        cwd=str(tmp_path),
    )


async def _call(params: StdioServerParameters, *codes: str) -> list[str]:
    """Run each code as one call of a single client connection; return the answers."""
    answers = []
    with anyio.fail_after(120):  # a hang guard, not a timing assertion
        async with Client(params) as client:
            for code in codes:
                result = await client.call_tool("run_code", {"code": code})
                assert not result.is_error, result
                answers.append("".join(getattr(block, "text", "") for block in result.content))
    return answers


def test_stdio_turns_share_state_per_conversation_and_across_server_processes(tmp_path: Path) -> None:
    (tmp_path / "hosttools.py").write_text(HOST_MODULE)
    env = {ENV["tools"]: "hosttools:TOOLS", ENV["allow"]: "wave"}
    first = _server(tmp_path, "--conversation", "desktop", env=env)  # the default isolation: worker processes

    async def first_turns() -> tuple[str, list[str]]:
        with anyio.fail_after(120):  # a hang guard, not a timing assertion
            async with Client(first) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert sorted(tools) == ["list_files", "read_file", "run_code", "write_file"]  # worker: a workspace
                assert tools["list_files"].annotations.read_only_hint is True  # type: ignore[union-attr]
                tool = tools["run_code"]
                assert tool.input_schema["required"] == ["code"]
                answers = []
                for code, failed in (("receipt = charge_card(12)\nreceipt", False), ("charge_card(500)", True)):
                    result = await client.call_tool("run_code", {"code": code})
                    assert result.is_error is failed, result
                    answers.append(result.content[0].text)
                # A chart a run saves under out/ crosses the wire as an image, and so does reading it back.
                chart = (  # pathlib does not stay: the next server, inline, refuses it
                    "import pathlib\npathlib.Path('out').mkdir()\ndel pathlib\n"
                    f"open('out/chart.png', 'wb').write(bytes.fromhex({PNG.hex()!r}))"
                )
                for result in (
                    await client.call_tool("run_code", {"code": chart}),
                    await client.call_tool("read_file", {"path": "out/chart.png"}),
                ):
                    image = result.content[-1]
                    assert isinstance(image, ImageContent) and base64.b64decode(image.data) == PNG, result
                return tool.description or "", answers

    description, answers = anyio.run(first_turns)
    assert "wave; and from the standard library: " in description
    assert "Only safe standard-library modules" not in description
    assert "def charge_card(amount: int) -> str" in description
    assert answers[0] == "'charged 12'"
    assert "the host function charge_card failed: ConnectionError: the payment gateway refused" in answers[1]

    # A new server process, as after a restart of the desktop client: the pinned conversation continues.
    second = _server(tmp_path, "--conversation", "desktop", "--isolation", "inline", env=env)
    assert anyio.run(_call, second, "receipt.upper()") == ["'CHARGED 12'"]


def test_without_a_pinned_conversation_each_server_is_its_own_conversation() -> None:
    async def calls(server: object, *codes: str) -> list[str]:
        with anyio.fail_after(120):
            async with Client(server) as client:  # type: ignore[arg-type]  # in-process, as over stdio: no headers
                return [(await client.call_tool("run_code", {"code": c})).content[0].text for c in codes]

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncPool("memory://", isolation="inline") as pool:
            tool = CodeTool(pool)
            first = await calls(build_server(tool), "x = 41", "x + 1")
            second = await calls(build_server(tool), "x")  # another server: another MCP session
            return first, second

    first, second = anyio.run(main)
    assert first == ["(no output)", "42"] and "NameError: name 'x' is not defined" in second[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_streamable_http_keeps_one_conversation_per_mcp_session(tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "server.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCELL_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "snapcell", "mcp", "--transport", "http", "--port", str(port)]
        + ["--isolation", "inline", "--store", f"file://{tmp_path / 'store'}", "--create"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        for _ in range(600):  # up to about a minute for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"

        async def talk() -> tuple[list[str], list[str], CallToolResult]:
            with anyio.fail_after(120):
                answers = []
                # mode="legacy": the initialize handshake, which opens an MCP session (mcp-session-id).
                async with Client(url, mode="legacy") as client:
                    for code in ("total = 20", "total + 1"):
                        answers.append((await client.call_tool("run_code", {"code": code})).content[0].text)
                others = []
                async with Client(url, mode="legacy") as other:
                    others.append((await other.call_tool("run_code", {"code": "total"})).content[0].text)
                async with Client(url) as sessionless:  # the 2026 protocol has no sessions
                    others.append((await sessionless.call_tool("run_code", {"code": "1 + 1"})).content[0].text)
                    failed = await sessionless.call_tool("run_code", {"code": "1 / 0"})
                return answers, others, failed

        answers, others, failed = anyio.run(talk)
        assert failed.is_error and "ZeroDivisionError" in failed.content[0].text  # type: ignore[union-attr]
        assert answers == ["(no output)", "21"]
        assert "NameError: name 'total' is not defined" in others[0]
        assert others[1].startswith("2\n[note]") and "not kept" in others[1]
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mcp", *argv])


def test_settings_come_from_flags_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV["allow"], "numpy, pandas")
    monkeypatch.setenv(ENV["wall_time"], "5s")
    monkeypatch.setenv(ENV["conversation"], "from-env")
    settings = settings_from_args(_args("--memory", "512MiB", "--conversation", "from-flag"))
    assert settings.allow == ("numpy", "pandas")
    assert settings.limits.wall_time_s == 5.0 and settings.limits.memory_bytes == 512 * 2**20
    assert settings.conversation == "from-flag"
    monkeypatch.setenv(ENV["isolation"], "sideways")
    with pytest.raises(ConfigError, match="isolation"):
        settings_from_args(_args())
    with pytest.raises(ConfigError):
        settings_from_args(_args("--conversation", "bad id with spaces"))


def test_tools_specs_fail_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "toolmod.py").write_text(textwrap.dedent(HOST_MODULE) + "NOT_A_TOOL = 3\n")
    assert set(load_tools(["toolmod:TOOLS"])) == {"charge_card"}
    assert set(load_tools(["toolmod:charge_card"])) == {"charge_card"}
    for spec, message in [
        ("toolmod", "module:attribute"),
        ("no_such_module_xyz:f", "cannot import"),
        ("toolmod:missing", "has no attribute"),
        ("toolmod:NOT_A_TOOL", "a function or a mapping"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_tools([spec])


# A 1x1 PNG, as matplotlib's savefig writes one (the same signature and chunks), without importing matplotlib.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c49444154789c63f8cfc0000003010100"
    "c9fe92ef0000000049454e44ae426082"
)


def _text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


def test_workspace_files_through_mcp_tools(tmp_path: Path) -> None:
    """write_file, read_file and list_files reach the same workspace run_code works in (process mode only); files
    a run writes under out/ come back as content a client can show, and binary files as bytes, not text."""

    async def main() -> tuple[dict[str, object], list[CallToolResult]]:
        async with AsyncPool(f"file://{tmp_path / 'store'}", create_store=True) as pool:
            tool = CodeTool(pool)
            with anyio.fail_after(120):
                async with Client(build_server(tool)) as client:  # type: ignore[arg-type]
                    tools = {t.name: t.annotations for t in (await client.list_tools()).tools}
                    calls = [
                        ("write_file", {"path": "in/n.txt", "content": "20"}),
                        (
                            "run_code",
                            {
                                "code": "import pathlib\nn = int(open('in/n.txt').read())\n"
                                "pathlib.Path('out').mkdir()\nopen('out/double.txt', 'w').write(str(2 * n))\n"
                                f"open('out/chart.png', 'wb').write(bytes.fromhex({PNG.hex()!r}))\n"
                                "open('out/blob.bin', 'wb').write(bytes(range(256)))",
                            },
                        ),
                        ("read_file", {"path": "out/double.txt"}),
                        ("list_files", {}),
                        ("write_file", {"path": "b.bin", "content": "//8=", "base64": True}),
                        ("read_file", {"path": "b.bin"}),
                        ("read_file", {"path": "out/chart.png"}),
                        ("read_file", {"path": "../etc/passwd"}),
                        ("write_file", {"path": "x.txt", "content": 3}),
                        ("run_code", {"code": "open('out/late.txt', 'w').write('x')\n1 / 0"}),
                    ]
                    return tools, [await client.call_tool(name, args) for name, args in calls]

    annotations, results = anyio.run(main)
    assert sorted(annotations) == ["list_files", "read_file", "run_code", "write_file"]
    for name in ("read_file", "list_files"):
        assert annotations[name].read_only_hint is True  # type: ignore[attr-defined]
    assert annotations["write_file"].read_only_hint is False  # type: ignore[attr-defined]
    assert annotations["write_file"].destructive_hint is True  # type: ignore[attr-defined]  # replaces a file
    assert annotations["write_file"].idempotent_hint is True  # type: ignore[attr-defined]
    assert annotations["run_code"].read_only_hint is False  # type: ignore[attr-defined]
    assert annotations["run_code"].idempotent_hint is False  # type: ignore[attr-defined]
    texts = [_text(r) for r in results]
    assert [r.is_error for r in results] == [False] * 7 + [True, True, True]
    assert texts[0].startswith("wrote in/n.txt (2 bytes)")
    # The run's answer is its text, then the files it wrote under out/: an image, a text and a binary resource.
    assert "[files] out/blob.bin (application/octet-stream, 256 bytes)" in texts[1]
    images = [c for c in results[1].content if isinstance(c, ImageContent)]
    resources = {
        c.resource.uri.rpartition("/")[2]: c.resource for c in results[1].content if isinstance(c, EmbeddedResource)
    }
    assert [i.mime_type for i in images] == ["image/png"] and base64.b64decode(images[0].data) == PNG
    assert sorted(resources) == ["blob.bin", "double.txt"]
    assert resources["double.txt"].text == "40"  # type: ignore[union-attr]
    assert base64.b64decode(resources["blob.bin"].blob) == bytes(range(256))  # type: ignore[union-attr]
    assert texts[2] == "40"
    assert "in/n.txt\t2 bytes" in texts[3] and "out/double.txt\t2 bytes" in texts[3]
    # A binary file comes back as its bytes: an embedded resource, or an image a client can show.
    resource = results[5].content[-1]
    assert isinstance(resource, EmbeddedResource) and base64.b64decode(resource.resource.blob) == b"\xff\xff"  # type: ignore[union-attr]
    assert "b.bin" in texts[5] and "2 bytes" in texts[5]
    picture = results[6].content[-1]
    assert isinstance(picture, ImageContent) and base64.b64decode(picture.data) == PNG
    assert "WorkspacePathError" in texts[7] and "climbs out" in texts[7]
    assert "'content' must be" in texts[8] and "pydantic" not in texts[8] and "http" not in texts[8]
    # A failed run is an error, with its usual text, and still shows what it wrote.
    assert "ZeroDivisionError" in texts[9]
    assert any(isinstance(c, EmbeddedResource) and c.resource.uri.endswith("out/late.txt") for c in results[9].content)


def test_attached_files_are_bounded() -> None:
    """At most MAX_ATTACHED_FILES files and MAX_CONTENT_BYTES bytes go with an answer, images first; the rest is
    named in a line, as is a file whose bytes did not come back from the worker."""
    files = [Artifact(path=f"out/{i:02}.txt", size_bytes=1, media_type="text/plain", data=b"x") for i in range(12)]
    files += [
        Artifact(path="out/huge.png", size_bytes=2**30, media_type="image/png", data=None),
        Artifact(
            path="out/big.bin", size_bytes=MAX_CONTENT_BYTES + 1, media_type="x", data=bytes(MAX_CONTENT_BYTES + 1)
        ),
        Artifact(path="out/chart.png", size_bytes=len(PNG), media_type="text/plain", data=PNG),  # a worker's word
    ]
    blocks = _attached(files)
    assert len(blocks) == MAX_ATTACHED_FILES + 1
    assert isinstance(blocks[0], ImageContent) and blocks[0].mime_type == "image/png"
    assert [b.resource.text for b in blocks[1:-1]] == ["x"] * (MAX_ATTACHED_FILES - 1)  # type: ignore[union-attr]
    note = blocks[-1].text  # type: ignore[union-attr]
    assert note.startswith("[files] not attached") and "out/huge.png" in note and "out/big.bin" in note
    assert "out/11.txt" in note and "out/00.txt" not in note


def test_failed_runs_are_tool_errors_with_the_answer_text() -> None:
    """Tracebacks, refused imports, time limits and MemoryError come back with isError, their text unchanged."""
    codes = ["x = 1", "1 / 0", "import socket", "raise MemoryError", "while True:\n    pass", "x + 1"]

    async def main() -> tuple[list[CallToolResult], list[str], dict[str, object], object]:
        async with AsyncPool("memory://", isolation="inline", limits=Limits(wall_time_s=0.3)) as pool:
            tool = CodeTool(pool)
            async with Client(build_server(tool, conversation="mcp-errors")) as client:  # type: ignore[arg-type]
                listed = (await client.list_tools()).tools[0]
                results = [await client.call_tool("run_code", {"code": code}) for code in codes]
            direct = [await tool.run_code("direct", code) for code in codes]
            return results, direct, listed.input_schema, listed.annotations

    results, direct, schema, annotations = anyio.run(main)
    assert [r.is_error for r in results] == [False, True, True, True, True, False]
    assert [_text(r) for r in results] == direct  # the same text as CodeTool.run_code
    assert "PolicyError" in direct[2] and "MemoryError" in direct[3] and "TimeLimitExceeded" in direct[4]
    assert schema == _run_code_schema()  # the schema CodeTool gives any other framework
    assert annotations.read_only_hint is False and annotations.open_world_hint is False  # type: ignore[attr-defined]


def _run_code_schema() -> dict[str, object]:
    from snapcell.tool import RunCodeArguments

    schema: dict[str, object] = RunCodeArguments.input_schema()
    return schema


def test_argument_errors_are_plain_words() -> None:
    async def main() -> list[CallToolResult]:
        async with AsyncPool("memory://", isolation="inline") as pool:
            async with Client(build_server(CodeTool(pool))) as client:  # type: ignore[arg-type]
                return [
                    await client.call_tool("run_code", arguments)
                    for arguments in ({}, {"code": 7}, {"code": "1", "setup": "maybe"}, {"code": "1", "setup": "true"})
                ]

    missing, number, setup, quoted = anyio.run(main)
    assert missing.is_error and number.is_error and setup.is_error and not quoted.is_error
    for result in (missing, number, setup):
        text = _text(result)
        assert "validation error" not in text and "http" not in text and "[type=" not in text, text
    assert "needs the argument 'code'" in _text(missing)
    assert "'code' must be a string, not 7" in _text(number)
    assert "'setup' must be true or false, not \"maybe\"" in _text(setup)


def test_a_server_that_cannot_start_tells_the_client_why(tmp_path: Path) -> None:
    params = _server(tmp_path, "--tools", "nosuchmod:TOOLS", "--isolation", "inline")

    async def connect() -> None:
        with anyio.fail_after(120), (tmp_path / "stderr").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)):  # type: ignore[arg-type]
                pass

    with pytest.raises(BaseExceptionGroup) as caught:  # the SDK's client raises from its task group
        anyio.run(connect)
    assert caught.group_contains(MCPError, match="could not start: ConfigError: --tools nosuchmod:TOOLS: cannot import")
    assert "cannot import 'nosuchmod'" in (tmp_path / "stderr").read_text()  # and the server's log says it too


def test_start_up_failures_answer_every_request_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "two", "method": "initialize", "params": {}},
    ]
    stdout = io.BytesIO()
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in requests)))
    )
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(stdout))
    monkeypatch.setenv(ENV["wall_time"], "soon")
    assert run_command(_args()) == 1
    replies = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [1, "two"]
    assert all(
        "could not start: ConfigError" in r["error"]["message"] and "soon" in r["error"]["message"] for r in replies
    )


def test_inline_servers_offer_no_file_tools() -> None:
    async def main() -> list[str]:
        async with AsyncPool("memory://", isolation="inline") as pool:
            async with Client(build_server(CodeTool(pool))) as client:  # type: ignore[arg-type]
                return sorted(t.name for t in (await client.list_tools()).tools)

    assert anyio.run(main) == ["run_code"]
