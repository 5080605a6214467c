"""A dump after a load does not scan again, in the runner, the frames the host's scan passed at that load."""

from __future__ import annotations

from typing import Any

import pytest

from snapcell import Pool
from snapcell.backends._backend import DumpRequest
from snapcell.backends._procbackend import MAX_PASSED_FRAMES, _dump_message
from snapcell.checkpoint import _pickle
from snapcell.interpreter._runner import Runner
from snapcell.worker._worker import _frame_hashes

# Dates pickle through a reducer, so their frame is not plain data (which is never scanned), and 3,000 of them make
# a frame above the frame-blob threshold (16 KiB): stored once as a blob, scanned by the host when new.
SETUP = "import datetime\nstamps = [datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(3000)]"


@pytest.mark.parametrize("passed", [True, False], ids=["host passed it", "host did not say"])
def test_a_loaded_frame_the_host_passed_is_not_scanned_again(monkeypatch: pytest.MonkeyPatch, passed: bool) -> None:
    scanned: list[int] = []
    real = _pickle.scan_pickle_data

    def counting(data: Any, rule: Any) -> Any:
        scanned.append(len(data))
        return real(data, rule)

    with Pool("memory://", isolation="inline") as pool:
        with pool.checkout() as session:
            session.feed_run(SETUP)
            checkpoint_id = session.dump()
        with pool.checkout() as session:
            session.load_session(checkpoint_id)
            if not passed:  # the runner is not told: it scans the frame itself
                monkeypatch.setattr(Runner, "dump", _untold(Runner.dump))
            monkeypatch.setattr(_pickle, "scan_pickle_data", counting)
            session.feed_run("n = len(stamps)")
            session.dump()
            assert session.feed_run("n, stamps[-1].year") == (3000, 2028)
    large = [size for size in scanned if size > 16 * 1024]
    assert len(large) == (0 if passed else 1), large


def _untold(dump: Any) -> Any:
    def untold(self: Runner, **kwargs: Any) -> Any:
        return dump(self, **{**kwargs, "passed_frames": ()})

    return untold


def test_the_dump_request_names_at_most_a_bound_of_passed_frames() -> None:
    frames = [f"{i:032x}" for i in range(MAX_PASSED_FRAMES + 10)]
    request = DumpRequest(created_at=0.0, level=1, on_unpicklable="skip", known_blobs={}, passed_frames=frames)
    assert _dump_message(request)["passed_frames"] == frames[:MAX_PASSED_FRAMES]


def test_the_worker_keeps_only_well_formed_frame_hashes() -> None:
    good = "0123456789abcdef" * 2
    assert _frame_hashes([good, good.upper(), good[:-1], 5, None, "z" * 32]) == [good]
    assert _frame_hashes("not a list") == [] and _frame_hashes(None) == []
    assert len(_frame_hashes([good] * 5000)) == 4096
