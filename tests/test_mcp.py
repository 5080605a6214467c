"""``snapcell mcp`` end to end, driven by the MCP SDK's own client over stdio and streamable HTTP."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from snapcell import AsyncPool, CodeTool
from snapcell.cli import build_parser
from snapcell.cli._mcp import ENV, build_server, load_tools, settings_from_args
from snapcell.errors import ConfigError

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
                tool = tools["run_code"]
                assert tool.input_schema["required"] == ["code"]
                answers = []
                for code in ("receipt = charge_card(12)\nreceipt", "charge_card(500)"):
                    result = await client.call_tool("run_code", {"code": code})
                    assert not result.is_error, result
                    answers.append(result.content[0].text)
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

        async def talk() -> tuple[list[str], list[str]]:
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
                return answers, others

        answers, others = anyio.run(talk)
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


def test_workspace_files_through_mcp_tools(tmp_path: Path) -> None:
    """write_file, read_file and list_files reach the same workspace run_code works in (process mode only)."""

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncPool(f"file://{tmp_path / 'store'}", create_store=True) as pool:
            tool = CodeTool(pool)
            with anyio.fail_after(120):
                async with Client(build_server(tool)) as client:  # type: ignore[arg-type]
                    names = sorted(t.name for t in (await client.list_tools()).tools)

                    async def call(name: str, **args: object) -> str:
                        return (await client.call_tool(name, args)).content[0].text  # type: ignore[union-attr]

                    texts = [
                        await call("write_file", path="in/n.txt", content="20"),
                        await call(
                            "run_code",
                            code="import pathlib\nn = int(open('in/n.txt').read())\n"
                            "pathlib.Path('out').mkdir()\nopen('out/double.txt', 'w').write(str(2 * n))",
                        ),
                        await call("read_file", path="out/double.txt"),
                        await call("list_files"),
                        await call("write_file", path="b.bin", content="//8=", base64=True),
                        await call("read_file", path="b.bin"),
                    ]
                    bad = await client.call_tool("read_file", {"path": "../etc/passwd"})
                    texts.append(str(bad.is_error) + " " + bad.content[0].text)  # type: ignore[union-attr]
            return names, texts

    names, texts = anyio.run(main)
    assert names == ["list_files", "read_file", "run_code", "write_file"]
    assert texts[0].startswith("wrote in/n.txt (2 bytes)")
    assert texts[2] == "40"
    assert "in/n.txt\t2 bytes" in texts[3] and "out/double.txt\t2 bytes" in texts[3]
    assert texts[5].endswith("//8=\n") and "binary file of 2 bytes" in texts[5]
    assert texts[6].startswith("True ") and "WorkspacePathError" in texts[6] and "climbs out" in texts[6]


def test_inline_servers_offer_no_file_tools() -> None:
    async def main() -> list[str]:
        async with AsyncPool("memory://", isolation="inline") as pool:
            async with Client(build_server(CodeTool(pool))) as client:  # type: ignore[arg-type]
                return sorted(t.name for t in (await client.list_tools()).tools)

    assert anyio.run(main) == ["run_code"]
