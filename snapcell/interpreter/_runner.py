"""A session's namespace and the three steps of a run: compile, execute, report.

`Runner` lives wherever the script runs: in the host (inline mode) or in a worker process.
It knows nothing of storage or signing; `dump` and `load` deal in unsigned checkpoint bodies.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import cached_property
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Literal

from snapcell._support import HELPERS_MODULE
from snapcell.errors import (
    LimitExceeded,
    MemoryLimitExceeded,
    PolicyError,
    RunCancelledError,
    ScriptError,
    ScriptSyntaxError,
    SnapcellError,
    TimeLimitExceeded,
)
from snapcell.interpreter._assigned import UNBOUND, assigned_names
from snapcell.interpreter._capture import capture_output
from snapcell.interpreter._cellcache import CellCache
from snapcell.interpreter._compile import RESULT_NAME, register_source
from snapcell.interpreter._definitions import Definitions, cell_bindings, setup_cells_assigning
from snapcell.interpreter._host import (
    HostBridge,
    HostFunction,
    ScriptPaused,
    bind_bridge,
    close_unstarted,
    unbind_bridge,
)
from snapcell.interpreter._interrupt import Watchdog, cancelled_error, reap_tasks, running_tasks
from snapcell.interpreter._memory import make_memory, serving_status
from snapcell.interpreter._result import RunResult
from snapcell.interpreter._stack import script_recursion_limit
from snapcell.interpreter._summary import summarize_namespace
from snapcell.limits import Limits
from snapcell.policy import (
    GUARD_GLOBALS,
    INTERNAL_NAMES,
    SAFE_DUNDERS,
    TICK_NAME,
    Policy,
    ScriptInterrupt,
    attribute_problem,
    is_dunder,
    name_denied,
    tick,
    with_file_access,
)

if TYPE_CHECKING:
    from snapcell.checkpoint import BlobRef, DroppedVariable, Dumped, FindGlobal, GlobalRule, Manifest

__all__ = ["DROPPED_PREFIX", "Runner", "checkpoint_rule", "dropped_note", "lost_at_load", "summarize_namespace"]

_TRIAL_TIME_S = 15.0
_MAX_STATIC_TYPES = 1000
_MAX_TYPE_CHARS = 1000
_NOT_VARIABLES = frozenset({"__builtins__", "__name__", RESULT_NAME})


def checkpoint_rule(policy: Policy) -> GlobalRule:
    """The policy's part of the checkpoint rule: the loader, the worker's dump and the host's scan all use it."""
    from snapcell.checkpoint import GlobalRule

    if not policy.restricted:
        return GlobalRule(allow_module=policy.allows_module)
    return GlobalRule(
        allow_module=policy.allows_module,
        deny_name=name_denied,
        deny_attribute=lambda name: attribute_problem(name) is not None,
        deny_code_name=_code_name_denied,
        stand_ins=frozenset(GUARD_GLOBALS),
    )


# Dunder names compiled script code uses beyond the policy's safe ones: frozen dataclasses' generated methods
# (``__setattr__``/``__delattr__``, ``__dataclass_*`` helpers) and the policy's own instrumentation.
_CODE_DUNDERS = frozenset({"__setattr__", "__delattr__"})
_CODE_PREFIXES = ("__dataclass_", "__snapcell_")


def _code_name_denied(name: str) -> bool:
    """Names restored bytecode may not use: what the policy would refuse as an attribute of script code."""
    if name in INTERNAL_NAMES:
        return name != "replace"  # str.replace is everywhere; code.replace needs a code object, which is a dunder away
    if is_dunder(name):
        return name not in SAFE_DUNDERS and name not in _CODE_DUNDERS and not name.startswith(_CODE_PREFIXES)
    return False


# Hashes of frames known to restore in this interpreter, kept at most (a set of 32-byte digests).
_MAX_RESTORED_FRAMES = 100_000


class Runner:
    """Runs cells in one persistent namespace.

    Args:
        policy: What scripts may import and touch.
        limits: Default limits for each run.
        file_access: Give scripts ``open`` and ``pathlib`` (a worker, confined to its workspace by Landlock).
        read_status: Gives the memory lines of the process's own ``/proc/self/status`` (a worker, whose sandbox
            hides ``/proc``); scripts see them through ``memory()`` and ``open("/proc/self/status")``. None: the
            session has no process of its own (inline), and ``memory()`` reports None.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        limits: Limits,
        file_access: bool = False,
        read_status: Callable[[], str | None] | None = None,
    ) -> None:
        if file_access:
            policy = with_file_access(policy)
        self.policy = policy
        self.limits = limits
        self.file_access = file_access
        self.builtins = policy.make_builtins(file_access=file_access)
        self.builtins[TICK_NAME] = tick
        self.builtins["memory"] = make_memory(read_status, lambda: self.limits.memory_bytes)
        if read_status is not None and file_access:
            self.builtins["open"] = serving_status(self.builtins["open"], read_status)
        self.namespace: dict[str, Any] = self._fresh_namespace()
        self.cells: list[str] = []
        self.setup_cells: list[str] = []
        self.cell_count = 0
        self.future_flags = 0
        self.pending_notes: list[str] = []
        # Setup cells to run before the next cell: after a restart, or to rebuild dropped variables.
        self.pending_setup: list[str] = []
        # Dropped variables those setup cells run again for (after a load), named in the note that says so.
        self.rebuilding: list[str] = []
        self._watch: Watchdog | None = None
        # The namespace the last run bound its host functions in, and their names (see `_bind_host_functions`).
        self._host_bound: tuple[dict[str, Any], frozenset[str]] | None = None
        self._cells = CellCache(policy)
        self.loaded = False  # the namespace came from a checkpoint (see `_loopfree.runs_without_loop`)
        self._restored: set[bytes] = set()
        # Pickles that passed `self.rule` at an earlier dump (the rule is fixed for the runner's life).
        self._scanned: set[bytes] = set()
        # Variables the last dump dropped and named, with the id of the value: the next dump names a variable again
        # only when it holds another value (a turn that does not touch a generator is not told about it again).
        self._named_drops: dict[str, int] = {}
        self.definitions = Definitions()
        # Static types of variables, as the type checker saw them made from the host stubs (`typecheck`): the
        # declarations of later checks use them instead of the values' own types while the values agree.
        self.static_types: dict[str, str] = {}
        # Definitions to run again before the next cell: their bytecode did not restore at load.
        self.pending_definitions: list[str] = []

    # The checkpoint code (pydantic, the picklers) is imported by the first dump or load, not by a run: a worker's
    # first cell does not wait for it.

    @cached_property
    def rule(self) -> GlobalRule:
        """The checkpoint rule of this runner's policy (`checkpoint_rule`)."""
        return checkpoint_rule(self.policy)

    @cached_property
    def _find_global(self) -> FindGlobal:
        from snapcell.checkpoint import make_find_global

        overrides = {
            (HELPERS_MODULE, "host_function"): _host_function,
            **self.policy.find_global_overrides(),
        }
        return make_find_global(self.rule, overrides, resolve=self.policy.global_resolver())

    @cached_property
    def _trial(self) -> Callable[[bytes, list[Any]], Any]:
        # dump() restores each new frame with the loader's unpickler, so what would fail at load is dropped now.
        from snapcell.checkpoint import make_trial_load

        return make_trial_load(self._find_global, self.builtins)

    def _fresh_namespace(self) -> dict[str, Any]:
        return {"__name__": "__main__", "__builtins__": self.builtins}

    # ------------------------------------------------------------------ run

    async def run(
        self,
        code: str,
        *,
        bridge: HostBridge,
        host_names: Collection[str],
        setup: bool = False,
        limits: Limits | None = None,
        report: bool = True,
        inputs: Mapping[str, Any] | None = None,
        types: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Compile, execute and report one cell; never raises for script problems.

        Args:
            code: The script.
            bridge: Where host-function calls go.
            host_names: Names of the host functions of this run, bound as proxies.
            setup: Keep the cell as a setup cell (run again after a restart) when it succeeds.
            limits: Limits for this run; the runner's defaults otherwise.
            report: Summarize the namespace and measure the CPU time of the run (``namespace_summary``,
                ``cpu_time_s``); False when nobody reads them.
            inputs: The run may pause: record its clocks and random sources (``result.inputs``), replaying what an
                earlier run of the cell recorded (``{}`` for a first run; see `snapcell.interpreter._replay`).
            types: The static types the type checker gave the names the cell binds (None: the cell was not
                checked); kept for the names it assigns when it succeeds (`static_types`).

        Returns:
            The result; ``error`` is set when the script failed, was blocked or timed out.
        """
        limits = limits or self.limits
        redefine, self.pending_definitions = self.pending_definitions, []
        for source in redefine:
            redone = await self._run_one(source, bridge, host_names, False, limits, [], report=False)
            if redone.error is not None:
                self.pending_notes.append(
                    f"re-running a definition failed ({redone.error.exc_type}: {redone.error.exc_message})"[:300]
                )
        backlog, self.pending_setup = self.pending_setup, []
        if backlog:
            failed = []
            for source in backlog:
                setup_result = await self._run_one(source, bridge, host_names, True, limits, [], report=False)
                if setup_result.error is not None:
                    failed.append(f"{setup_result.error.exc_type}: {setup_result.error.exc_message}"[:200])
            count = f"{len(backlog)} setup cell{'s' if len(backlog) != 1 else ''}"
            rebuilt, self.rebuilding = self.rebuilding, []
            why = ": the setup cells that assign them rebuild what the checkpoint could not save"
            self.pending_notes.append(
                f"{count} {'was' if len(backlog) == 1 else 'were'} run again"
                + (f"{why} ({', '.join(rebuilt)})" if rebuilt else "")
                + (f"; {len(failed)} failed ({'; '.join(failed)})" if failed else "")
            )
        notes, self.pending_notes = self.pending_notes, []
        if inputs is None:
            result = await self._run_one(code, bridge, host_names, setup, limits, notes, report=report)
        else:
            from dataclasses import replace

            from snapcell.interpreter._replay import Inputs, recording

            record = Inputs(inputs)
            with recording(record):
                result = await self._run_one(code, bridge, host_names, setup, limits, notes, report=report)
            result = replace(result, inputs=record.export())
        self._note_types(result, types)
        return result

    def _note_types(self, result: RunResult, types: Mapping[str, str] | None) -> None:
        """Keep the static types a checked run gave the names it assigned; forget those of names assigned otherwise."""
        kept = types if types is not None and result.error is None else {}
        for name in result.assigned:
            static = kept.get(name)
            room = name in self.static_types or len(self.static_types) < _MAX_STATIC_TYPES
            if static is not None and room and len(static) <= _MAX_TYPE_CHARS:
                self.static_types[name] = static
            else:
                self.static_types.pop(name, None)

    async def _run_one(
        self,
        code: str,
        bridge: HostBridge,
        host_names: Collection[str],
        setup: bool,
        limits: Limits,
        notes: list[str],
        *,
        report: bool = True,
    ) -> RunResult:
        start = time.perf_counter()
        filename = f"<cell-{self.cell_count + 1}>"
        if not isinstance(code, str):
            return RunResult(
                error=ScriptSyntaxError(f"a script must be text, not {type(code).__name__}"), notes=tuple(notes)
            )
        try:
            prepared = self._cells.prepare(code, filename, self.future_flags)
        except (ScriptSyntaxError, PolicyError) as exc:
            return RunResult(error=exc, duration_s=time.perf_counter() - start, notes=tuple(notes))
        cell = prepared.cell
        self.cell_count += 1
        self.cells.append(code)
        self.future_flags = cell.future_flags
        self._bind_host_functions(host_names)
        value, error = None, None
        # Only names the cell can bind are watched, so this costs the cell's size, not the namespace's.
        before = {name: id(self.namespace.get(name, UNBOUND)) for name in prepared.bindable}
        cpu_start = time.process_time() if report else None  # a clock_gettime syscall, in a worker
        caller_cancelled = False
        with capture_output(limits.max_output_bytes) as (out, err):
            bridge_token = bind_bridge(bridge)
            watchdog = Watchdog(limits.wall_time_s, self.namespace)
            self._watch = watchdog
            try:
                with script_recursion_limit(limits.max_recursion_depth):
                    value, error = await self._execute(cell.code, cell.is_async, watchdog, bridge)
            except cancelled_error():
                caller_cancelled = True  # the awaiting caller was cancelled (inline mode): end the run as cancelled
            finally:
                self._watch = None
                watchdog.stop()
                unawaited = unbind_bridge(bridge_token)
        assigned = assigned_names(before, self.namespace, skip=_NOT_VARIABLES)
        if caller_cancelled or watchdog.cancelled:
            value, error = (
                None,
                RunCancelledError(
                    "the run was cancelled by its caller",
                    hint="Variables assigned before it stopped are kept.",
                ),
            )
            notes.append(
                f"cancelled after {time.perf_counter() - start:.1f} s; variables it had assigned are kept"
                + (f": {', '.join(assigned)}" if assigned else " (it had assigned none)")
            )
        elif watchdog.fired:
            error = self._time_error(limits)
            notes.append(
                f"stopped after {limits.wall_time_s:g} s (the wall-time limit); earlier variables are still defined"
            )
        if error is not None and self.file_access and not error.hint:
            error.hint = _path_hint(error.__cause__)
        if prepared.defines:  # else recording finds nothing to keep (and would parse the cell again to see so)
            self.definitions.record(code, self.namespace)
        if error is None and setup and code not in self.setup_cells:
            self.setup_cells.append(code)
        value = value if cell.has_value else None
        if type(value) is CoroutineType:  # the script's own coroutine (a host function's is closed already)
            own = close_unstarted(value)
            unawaited += [own] if own is not None else []
        if unawaited:
            notes.append(_unawaited_note(unawaited))
        result = RunResult(
            value=value,
            value_repr=_render(value, limits.max_value_repr_bytes) if cell.has_value and error is None else None,
            stdout=out.getvalue(),
            stderr=err.getvalue(),
            duration_s=time.perf_counter() - start,
            notes=tuple(notes),
            error=error,
            external_calls=tuple(getattr(bridge, "calls", ())),
            namespace_summary=summarize_namespace(self.namespace) if report else "",
            cpu_time_s=None if cpu_start is None else time.process_time() - cpu_start,
            assigned=assigned,
        )
        if caller_cancelled:
            from snapcell.errors import RunCancelled  # an asyncio.CancelledError: imports asyncio

            raise RunCancelled(result)
        return result

    async def _execute(
        self, code: Any, is_async: bool, watchdog: Watchdog, bridge: HostBridge
    ) -> tuple[Any, ScriptError | None]:
        namespace = self.namespace
        before = running_tasks()
        try:
            try:
                if is_async:
                    import asyncio

                    task = asyncio.ensure_future(eval(code, namespace))
                    watchdog.attach(task)
                    await task
                else:
                    exec(code, namespace)
                return namespace.pop(RESULT_NAME, None), None
            finally:
                namespace.pop(RESULT_NAME, None)
                # Tasks the script started (even from a sync cell) must not outlive the run.
                await reap_tasks(before, namespace, (bridge,))
        except cancelled_error():
            if not watchdog.fired:
                raise  # the caller was cancelled, not the script
            return None, None
        except ScriptInterrupt:
            return None, None
        except ScriptPaused:
            return None, None  # the host knows where and why: it asked for the pause
        except SnapcellError as exc:
            if isinstance(exc, ScriptError | LimitExceeded):
                return None, _locate(exc)
            return None, _script_error(exc)
        except MemoryError as exc:
            return None, _memory_error(exc, self.limits)
        except BaseException as exc:  # the script boundary: SystemExit, KeyboardInterrupt, ...
            return None, _script_error(exc)

    def cancel(self) -> None:
        """Interrupt the run in progress, if any, as cancelled by its caller; safe from any thread.

        The script stops where it is, like at its wall-time limit, and its variables are kept.
        """
        watch = self._watch
        if watch is not None:
            watch.cancel()

    def _time_error(self, limits: Limits) -> TimeLimitExceeded:
        return TimeLimitExceeded(
            f"the script was stopped after {limits.wall_time_s:g} s",
            limit="wall_time_s",
            value=limits.wall_time_s,
            hint="Earlier variables are still defined. Do the work in smaller steps, one run each.",
        )

    def _bind_host_functions(self, host_names: Collection[str]) -> None:
        """Bind this run's host functions by name, and unbind those of earlier runs that it does not have.

        Only the names the last run bound are looked at, not the whole namespace (a walk of every variable on every
        run); a namespace this runner has not bound in yet (a new one, or one loaded) is walked once.
        """
        namespace = self.namespace
        bound = self._host_bound
        if bound is not None and bound[0] is namespace:
            earlier = [(name, namespace.get(name)) for name in bound[1]]
        else:
            earlier = list(namespace.items())
        for name, value in earlier:
            if isinstance(value, HostFunction) and value.host_name == name and name not in host_names:
                del namespace[name]
        for name in host_names:
            namespace[name] = HostFunction(name)
        self._host_bound = (namespace, frozenset(host_names))

    # -------------------------------------------------------- checkpoint

    def variables(self) -> dict[str, Any]:
        """The namespace's variables: everything but builtins and host-function bindings."""
        return {
            name: value
            for name, value in self.namespace.items()
            if name not in _NOT_VARIABLES and not (isinstance(value, HostFunction) and value.host_name == name)
        }

    def dump(
        self,
        *,
        created_at: float,
        level: int = 1,
        on_unpicklable: Literal["skip", "fail"] = "skip",
        known_blobs: Mapping[str, BlobRef] | None = None,
        passed_frames: Collection[str] = (),
    ) -> Dumped:
        """Serialize the namespace into an unsigned checkpoint body and the blobs it needs.

        Args:
            created_at: Creation time for the manifest.
            level: zstd level.
            on_unpicklable: What to do with a variable that cannot be serialized.
            known_blobs: Blobs the store already has, by hash; they are referenced, not encoded again.
            passed_frames: Hashes (hex) of frame blobs the host's scan passed under this runner's policy (its
                rule): a frame pickled to those bytes is not scanned again here. Only what the host asserts; the
                host scans every frame it has not passed itself before signing.

        Raises:
            UnpicklableValue: With ``on_unpicklable="fail"``, when a variable cannot be serialized.
        """
        from snapcell.checkpoint import DumpOptions, dump_namespace

        for digest in passed_frames:
            if len(self._scanned) < _MAX_RESTORED_FRAMES:
                self._scanned.add(bytes.fromhex(digest))
        options = DumpOptions(level=level, on_unpicklable=on_unpicklable, rule=self.rule, trial=self._bounded_trial)
        dumped = dump_namespace(
            self.variables(),
            namespace=self.namespace,
            created_at=created_at,
            options=options,
            setup_cells=self.setup_cells,
            cells=self.cells,
            cell_count=self.cell_count,
            future_flags=self.future_flags,
            definitions=self.definitions.sources(),
            static_types=self.static_types,
            known_blobs=known_blobs,
            restored=self._restored,
            scanned=self._scanned,
        )
        dropped = dumped.manifest.dropped
        new = [d for d in dropped if self._named_drops.get(d.name) != id(self.namespace.get(d.name))]
        self._named_drops = {d.name: id(self.namespace.get(d.name)) for d in dropped}
        note = dropped_note(new, self.definitions, self.setup_cells)
        if note:
            self.pending_notes.append(note)
        return dumped

    def _bounded_trial(self, data: bytes, buffers: list[Any]) -> Any:
        """The dump's trial restore of one frame, interrupted after a quarter of the dump's time limit.

        A value whose restore loops (a script ``__setstate__``) is then dropped and named, not the whole dump lost.
        """
        if not self.cell_count or self.limits.wall_time_s is None:
            # No script has run, or scripts run unbounded here (the worker's warm-up, before its sandbox: the
            # watchdog's thread must not start there); the dump's own watchdog still bounds the worker.
            return self._trial(data, buffers)
        budget = self.limits.dump_time_s / 4 if self.limits.dump_time_s is not None else _TRIAL_TIME_S
        watchdog = Watchdog(budget, self.namespace)
        try:
            return self._trial(data, buffers)
        except ScriptInterrupt as exc:
            raise TimeoutError(f"restoring it did not finish within {budget:g} s") from exc
        finally:
            watchdog.stop()

    def load(
        self,
        body: bytes | bytearray | memoryview,
        blobs: Mapping[str, bytes | bytearray | memoryview] | None = None,
        *,
        manifest: Manifest | None = None,
    ) -> Manifest:
        """Replace the namespace with a verified checkpoint body; on error the namespace is unchanged.

        Args:
            body: The verified body.
            blobs: The stored bytes of the blobs it refers to, by hash hex.
            manifest: The manifest already parsed from these very bytes (not parsed again); it is what is returned.

        Raises:
            CheckpointCorrupt: The body is malformed, or a blob is missing or altered.
            CheckpointVersionError: A checkpoint format this snapcell cannot read.
        """
        from snapcell.checkpoint import load_namespace

        namespace = self._fresh_namespace()
        loaded = load_namespace(
            body,
            namespace=namespace,
            find_global=self._find_global,
            max_raw_bytes=self.limits.memory_bytes,
            blobs=blobs,
            manifest=manifest,
        )
        namespace.update(loaded.variables)
        # Frames that just restored with this runner's own unpickler need no trial restore at the next dump.
        if len(self._restored) + len(loaded.restored) > _MAX_RESTORED_FRAMES:
            self._restored.clear()
        self._restored.update(loaded.restored)
        # cloudpickle hands restored functions the real builtins; the policy's go back in.
        namespace["__builtins__"] = self.builtins
        namespace["__name__"] = "__main__"
        manifest = loaded.manifest
        self.namespace = namespace
        self.loaded = True
        self.setup_cells = list(manifest.setup_cells)
        self.static_types = dict(itertools.islice(manifest.types.items(), _MAX_STATIC_TYPES))
        self.cell_count = manifest.cell_count
        self.future_flags = manifest.future_flags
        self.cells = list(manifest.cells)
        first = manifest.cell_count - len(manifest.cells) + 1
        for offset, source in enumerate(manifest.cells):
            register_source(f"<cell-{first + offset}>", source)
        self._named_drops = {}  # what the checkpoint dropped is not in the namespace: a new value is a new drop
        self.definitions = Definitions(manifest.definitions)
        # Functions and classes the dump could not keep as values but whose source it kept come back from it;
        # other dropped variables from the setup cells that assign them, run again before the next cell.
        redefined, rebuilt = rebuilt_at_load(manifest.dropped, self.definitions, manifest.setup_cells)
        gone = [d for d in manifest.dropped if d.name not in redefined and d.name not in rebuilt]
        notes = [dropped_note(gone)] if gone else []
        rebuild = setup_cells_assigning(set(rebuilt), manifest.setup_cells)
        if rebuild:
            self.pending_setup.extend(rebuild)
            self.rebuilding = rebuilt
        sources, covered = self.definitions.for_names({*loaded.failed, *redefined})
        self.pending_definitions = sources
        if covered:
            notes.append(
                f"re-created from their source (their saved form did not restore or could not be saved): "
                f"{', '.join(covered)}; objects made by the old definitions are not restored with them"
            )
        lost = {name: reason for name, reason in loaded.failed.items() if name not in covered}
        if lost:
            types_of = {v.name: v.type_name for v in manifest.variables}
            names = ", ".join(f"{name} ({types_of.get(name, '?')}: {reason})" for name, reason in lost.items())
            notes.append(f"could not be restored: {names}")
        self.pending_notes.extend(notes)
        return manifest


DROPPED_PREFIX = "not saved in the checkpoint"


def rebuilt_at_load(
    dropped: Iterable[DroppedVariable], definitions: Definitions | Iterable[str], setup_cells: Iterable[str]
) -> tuple[list[str], list[str]]:
    """The names of ``dropped`` a load brings back: re-created from their kept source, and rebuilt by setup cells.

    Args:
        dropped: What a dump did not save.
        definitions: The kept definitions (or a manifest's statements).
        setup_cells: The session's setup cells.
    """
    dropped = list(dropped)
    if not dropped:
        return [], []
    if not isinstance(definitions, Definitions):
        definitions = Definitions(definitions)
    redefined = definitions.recreatable((d.name, d.type_name) for d in dropped)
    bound = set().union(*(cell_bindings(source) for source in setup_cells))
    return redefined, [d.name for d in dropped if d.name not in redefined and d.name in bound]


def lost_at_load(manifest: Manifest) -> list[str]:
    """The variables a load of ``manifest``'s checkpoint does not bring back (dropped, and rebuilt by nothing)."""
    redefined, rebuilt = rebuilt_at_load(manifest.dropped, manifest.definitions, manifest.setup_cells)
    return [d.name for d in manifest.dropped if d.name not in redefined and d.name not in rebuilt]


def dropped_note(
    dropped: Iterable[DroppedVariable],
    definitions: Definitions | Iterable[str] = (),
    setup_cells: Iterable[str] = (),
) -> str:
    """One line naming the variables a dump did not save, each with its type and why ("" when there are none).

    Args:
        dropped: What the dump did not save.
        definitions: The kept definitions (or a manifest's statements): a function or class they re-create at load
            is named as kept by its source, not as gone.
        setup_cells: The session's setup cells: a variable one of them assigns is named as rebuilt by it at load.
    """
    dropped = list(dropped)
    redefined, rebuilt = rebuilt_at_load(dropped, definitions, setup_cells)
    gone = "; ".join(
        f"{d.name} ({d.type_name}) {d.reason}" for d in dropped if d.name not in redefined and d.name not in rebuilt
    )
    parts = [f"{DROPPED_PREFIX}, so gone next turn: {gone}; recreate them if needed"] if gone else []
    if redefined:
        parts.append(f"{DROPPED_PREFIX} as a value, re-created from its source when loaded: {', '.join(redefined)}")
    if rebuilt:
        parts.append(
            f"{DROPPED_PREFIX} as a value, rebuilt by running its setup cell again when loaded: {', '.join(rebuilt)}"
        )
    return "; ".join(parts)


def _host_function(name: str) -> HostFunction:
    return HostFunction(name)


def _locate(error: ScriptError) -> ScriptError:
    """Give an error raised during the run (a host-call limit, say) the script line it came from."""
    if error.lineno is None:
        import traceback  # an error's path only: a worker's first run does not import it

        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith("<cell-")]
        if frames:
            error.lineno, error.cell = frames[-1].lineno, frames[-1].filename
            error.traceback_text = "\n".join(
                ["Traceback (most recent call last):", *(s.rstrip("\n") for s in traceback.format_list(frames))]
                + [f"{error.exc_type}: {error.exc_message}"]
            )
    return error


def _path_hint(exc: BaseException | None) -> str:
    """The hint for a file error on an absolute path outside the working directory (the workspace), else ``""``."""
    import os  # an error's path only

    if not isinstance(exc, OSError) or not isinstance(exc.filename, str) or not os.path.isabs(exc.filename):
        return ""
    try:
        inside = os.path.commonpath([os.getcwd(), os.path.abspath(exc.filename)]) == os.getcwd()
    except (OSError, ValueError):
        return ""
    if inside:
        return ""
    name = os.path.basename(exc.filename.rstrip("/")) or "data.csv"
    return (
        f"The working directory is the workspace: use a path relative to it ({name!r}, not {exc.filename!r}); "
        "nothing outside the workspace and its mounted folders can be reached."
    )


def _unawaited_note(names: list[str]) -> str:
    """The note on coroutines a run made and never awaited: they did not run."""
    counts = dict.fromkeys(names, 0)
    for name in names:
        counts[name] += 1
    shown = [f"{name}()" + (f" ({count} calls)" if count > 1 else "") for name, count in list(counts.items())[:5]]
    first = next(iter(counts))
    return (
        f"{', '.join(shown)} {'was' if len(names) == 1 else 'were'} called without `await`, so "
        f"{'it' if len(names) == 1 else 'they'} did not run and gave a coroutine: did you forget `await`? Write "
        f"`await {first}(...)`, or `await asyncio.gather(...)` for several calls at once"
    )


def _render(value: Any, limit: int | None) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a script-defined __repr__ may raise anything
        return f"<{type(value).__name__} object; repr() failed: {type(exc).__name__}: {exc}>"
    if limit is not None and len(text) > limit:
        return f"{text[: limit // 2]} ...[{len(text) - limit} characters cut]... {text[-(limit // 2) :]}"
    return text


def _memory_error(exc: MemoryError, limits: Limits) -> MemoryLimitExceeded:
    base = _script_error(exc)
    limit = f"{limits.memory_bytes / 2**20:.0f} MiB" if limits.memory_bytes else "the memory available"
    error = MemoryLimitExceeded(
        f"the script ran out of memory ({limit})",
        limit="memory_bytes",
        value=limits.memory_bytes,
        exc_type="MemoryError",
        exc_message=str(exc),
        traceback_text=base.traceback_text,
        lineno=base.lineno,
        cell=base.cell,
        hint="Earlier variables are still defined. Work on smaller pieces, or delete large variables you do not need.",
    )
    error.__cause__ = exc
    return error


def _shorten(message: str, limit: int = 1000) -> str:
    """The message, cut in the middle only when it is very long (the end usually says the most)."""
    return message if len(message) <= limit else f"{message[: limit // 4]} ... {message[-(limit * 3 // 4) :]}"


def _script_error(exc: BaseException) -> ScriptError:
    import traceback  # an error's path only: a worker's first run does not import it

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell-")]
    message = str(exc) if not isinstance(exc, KeyError) else repr(exc.args[0]) if exc.args else ""
    exc_type = type(exc).__name__
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):")
        lines.extend(s.rstrip("\n") for s in traceback.format_list(frames))
    lines.append(f"{exc_type}: {message}" if message else exc_type)
    hint = ""
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        hint = "Scripts cannot exit the session; return a value instead."
    last = frames[-1] if frames else None
    error = ScriptError(
        f"{exc_type}: {_shorten(message)}".rstrip(": "),
        exc_type=exc_type,
        exc_message=message,
        traceback_text="\n".join(lines),
        lineno=last.lineno if last else None,
        cell=last.filename if last else None,
        hint=hint,
    )
    error.__cause__ = exc
    return error
