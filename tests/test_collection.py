"""Collecting the suite stays cheap: test modules leave heavy libraries to the tests that use them,
and pytest imports them with Python's automatic garbage collection paused (tests/conftest.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import conftest, lanes
from tests.conftest import collector_paused

TESTS = Path(__file__).parent

# Each takes from a few tenths of a second to seconds to import and only some tests need it: those
# tests (or their fixtures) import it, never a test module or conftest.py at its top.
HEAVY = [
    "transformers",
    "qwen_asr",
    "librosa",
    "scipy",
    "accelerate",
    "peft",
    "bitsandbytes",
    "triton",
    "numba",
    "sympy",
]

GC_ON_WHILE_IMPORTED = gc.isenabled()  # pytest imported this module while collecting the suite


def test_importing_every_test_module_and_conftest_loads_no_heavy_library():
    names = sorted(
        ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        for path in TESTS.rglob("*.py")
        if path.name.startswith("test_") or path.name == "conftest.py"
    )
    assert "tests.app.conftest" in names and "tests.asr.test_models" in names
    # tests.conftest first, as pytest does (it imports torch before anything imports PySide6)
    script = textwrap.dedent(f"""
        import gc, importlib, sys
        import pytest
        gc.disable()
        for name in ["tests.conftest"] + {names!r}:
            try:
                importlib.import_module(name)
            except pytest.skip.Exception:
                pass
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]"


def test_test_modules_are_imported_with_the_collector_paused_and_run_with_it_on():
    assert GC_ON_WHILE_IMPORTED is False
    assert gc.isenabled()


class _Collected:
    """An object made while the suite was collected."""


MADE_AT_COLLECTION = _Collected()


def test_what_collection_left_alive_is_out_of_the_collectors_sight():
    """So that a full collection during the run (after every app test) does not walk the whole suite."""
    assert gc.get_freeze_count() > 10_000
    assert not any(o is MADE_AT_COLLECTION for o in gc.get_objects())
    made_now = _Collected()
    assert any(o is made_now for o in gc.get_objects())


def test_collector_paused_turns_collection_on_again_after_an_error():
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("inside")
    assert gc.isenabled()


def test_collector_paused_leaves_collection_off_where_it_was_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Item:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid


class _Config:
    def __init__(self, workers: int = 2):
        self.workerinput = {"workercount": workers}

    def getvalue(self, name):
        return {"dist": "load", "tx": [f"{self.workerinput['workercount']}*popen"]}.get(name)

    def getoption(self, name, default=None):
        return default


def test_the_order_deals_the_long_modules_to_each_worker_and_ends_with_the_fast_ones(monkeypatch):
    import tests.conftest as conftest

    monkeypatch.setattr(lanes, "MODULE_SECONDS", {"a.py": 90, "b.py": 60, "c.py": 40, "d.py": 8, "e.py": 3})
    monkeypatch.setattr(lanes, "DEALT_SECONDS", 20)
    names = ["fast1.py", "e.py", "a.py", "fast2.py", "d.py", "b.py", "c.py"]
    count = {"fast1.py": 100, "fast2.py": 100}  # the others: 10 items each
    items = [_Item(f"{name}::t{i}") for name in names for i in range(count.get(name, 10))]
    conftest.pytest_collection_modifyitems(_Config(2), items)
    modules = [item.nodeid.split("::")[0] for item in items]
    block = len(items) // 2 // 4  # pytest-xdist's first block for each worker: 31 items
    assert modules[:10] == ["a.py"] * 10  # the first worker's lane (the longest module, 90 s) ...
    assert modules[10:block] == ["d.py"] * 10 + ["e.py"] * 10 + ["fast1.py"]  # ... filled up, longest first
    assert modules[block : block + 20] == ["b.py"] * 10 + ["c.py"] * 10  # the second worker's lane: 60 + 40 s
    assert list(dict.fromkeys(modules)) == ["a.py", "d.py", "e.py", "fast1.py", "b.py", "c.py", "fast2.py"]
    for name in names:  # each module's items together and in their order
        own = [item.nodeid for item in items if item.nodeid.startswith(name)]
        assert own == [f"{name}::t{i}" for i in range(count.get(name, 10))]


class _Node:
    shutting_down = False

    def __init__(self, k: int):
        self.sent: list[list[int]] = []
        self.gateway = type("Gateway", (), {"id": f"gw{k}"})()

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True


def test_after_the_first_blocks_a_worker_gets_at_most_a_few_items_at_a_time():
    import tests.conftest as conftest

    scheduler = conftest.pytest_xdist_make_scheduler(_Config(), None)
    nodes = [_Node(0), _Node(1)]
    collection = [f"m.py::t{i}" for i in range(400)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    assert [len(node.sent[0]) for node in nodes] == [50, 50]  # the first blocks: 400 // 2 // 4
    while scheduler.pending:  # the first worker runs its items; the other is busy on a long one
        node = nodes[0]
        index = scheduler.node2pending[node][0]
        scheduler.mark_test_complete(node, index, 0.01)
    later = nodes[0].sent[1:]
    assert later and max(map(len, later)) <= 8 == lanes.TAIL_CHUNK  # xdist alone: up to 39 at a time here
    # what the first worker holds once nothing is left to hand out: a few items, not a quarter of the run
    assert len(scheduler.node2pending[nodes[0]]) <= 16


WAITS = sorted(lanes.WAIT_MODULES)


def _suite(items_per_module: int = 10) -> list[_Item]:
    """A collection of CPU modules and waiting ones, mixed as pytest collects them (by path)."""
    names = sorted(["tests/a.py", "tests/b.py", "tests/fast.py", *WAITS[:3]])
    return [_Item(f"{name}::t{i}") for name in names for i in range(items_per_module)]


def test_with_three_workers_the_waiting_modules_go_first_and_the_rest_is_ordered_for_two(monkeypatch):
    monkeypatch.setattr(lanes, "MODULE_SECONDS", {"tests/a.py": 90, "tests/b.py": 60, WAITS[1]: 50})
    items = _suite()
    ordered = lanes.order(list(items), 3)
    modules = list(dict.fromkeys(lanes.module_of(item.nodeid) for item in ordered))
    assert modules[:3] == [WAITS[1], WAITS[0], WAITS[2]]  # all of them, the longest first
    assert modules[3:] == ["tests/a.py", "tests/b.py", "tests/fast.py"]  # a lane each, then the fast
    # two workers: no waiting lane, the waiting modules are ordered by their seconds like the others
    two = list(dict.fromkeys(lanes.module_of(item.nodeid) for item in lanes.order(list(items), 2)))
    assert two == ["tests/a.py", "tests/b.py", WAITS[1], WAITS[0], WAITS[2], "tests/fast.py"]


def test_the_waiting_lane_gets_every_waiting_item_at_once_and_nothing_else():
    import tests.conftest as conftest

    items = lanes.order(_suite(40), 3)
    collection = [item.nodeid for item in items]
    scheduler = conftest.pytest_xdist_make_scheduler(_Config(3), None)
    nodes = [_Node(2), _Node(0), _Node(1)]  # in the order they came up
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    waiter, cpu = nodes[0], nodes[1:]
    waiting = [i for i, nodeid in enumerate(collection) if lanes.module_of(nodeid) in lanes.WAIT_MODULES]
    assert len(waiting) == 120 and waiter.sent == [waiting] and waiter.shutting_down
    assert [len(node.sent[0]) for node in cpu] == [15, 15]  # 120 CPU items // 2 // 4
    while any(scheduler.node2pending[node] for node in cpu):  # the CPU lanes run, and the waiting lane
        for node in (*cpu, waiter):
            if scheduler.node2pending[node]:
                scheduler.mark_test_complete(node, scheduler.node2pending[node][0], 0.01)
    to_cpu = sorted(i for node in cpu for batch in node.sent for i in batch)
    assert to_cpu == [i for i in range(len(collection)) if i not in waiting]  # every CPU item once
    assert len(waiter.sent) == 1 and all(node.shutting_down for node in cpu)


def test_with_two_workers_or_no_waiting_module_there_is_no_waiting_lane():
    assert lanes.waiting_lane(3, [item.nodeid for item in _suite()])
    assert not lanes.waiting_lane(2, [item.nodeid for item in _suite()])
    assert not lanes.waiting_lane(3, ["tests/a.py::t0", "tests/b.py::t1"])


@pytest.mark.parametrize(
    ("worker", "count", "niceness"), [("gw0", "3", 10), ("gw1", "3", 10), ("gw2", "3", 0), ("gw1", "2", 0)]
)
def test_the_cpu_lanes_run_at_a_lower_priority_than_the_waiting_lane(worker, count, niceness):
    script = "import os; from tests import lanes; lanes.nice_cpu_lane(); print(os.nice(0))"
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": count}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == min(19, os.nice(0) + niceness)  # 19 at most (this test may run in a CPU lane)


class _Next:
    def __init__(self, *fixturenames: str):
        self.fixturenames = list(fixturenames)


def test_the_kept_models_stay_for_a_next_test_that_asks_for_engines_and_go_otherwise(monkeypatch):
    assert conftest.models_wanted_next(_Next("tmp_path", "engine_factory"))
    assert not conftest.models_wanted_next(_Next("tmp_path", "qtbot"))
    assert not conftest.models_wanted_next(None)  # the worker's last test

    dropped = []
    official = type(sys)("tests.oracle.official")
    official.oracles_kept = lambda: 1 - len(dropped)
    official.drop_oracles = lambda: dropped.append(True)
    monkeypatch.setitem(sys.modules, "tests.oracle.official", official)
    monkeypatch.setattr(conftest._kept_engines, "engines", {("folder", "fp32"): object()})
    assert conftest.release_models() is True
    assert conftest._kept_engines.engines == {} and dropped == [True]
    assert conftest.release_models() is False  # nothing was held


def test_the_waiting_lane_builds_checkpoints_without_the_official_package(tmp_path):
    """The same files as a build here, and the waiting lane's worker never imports qwen_asr for them."""
    from tests.oracle.checkpoints import build_tiny_checkpoint

    kwargs = {"seed": 3, "text_dims": {"num_hidden_layers": 1}, "extra_active": (11, 12)}
    script = textwrap.dedent(f"""
        import sys
        from tests.oracle.checkpoints import cached_checkpoint
        print(cached_checkpoint(sys.argv[1], **{kwargs!r}))
        print(sorted(m for m in ("qwen_asr", "transformers") if m in sys.modules))
    """)
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw2", "PYTEST_XDIST_WORKER_COUNT": "3"}
    command = [sys.executable, "-c", script, str(tmp_path / "lane")]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built, imported = proc.stdout.splitlines()[-2:]
    assert imported == "[]"
    here = build_tiny_checkpoint(tmp_path / "here", **kwargs)
    names = sorted(path.name for path in here.iterdir())
    assert "model.safetensors" in names and names == sorted(path.name for path in Path(built).iterdir())
    for name in names:
        assert (Path(built) / name).read_bytes() == (here / name).read_bytes(), name


def test_a_big_child_waits_while_another_workers_big_child_runs():
    script = "from tests import lanes\nwith lanes.one_big_child_at_a_time():\n    print('ran', flush=True)"
    with lanes.one_big_child_at_a_time():
        other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=TESTS.parent)
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=1.5)  # the other worker's child waits
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 0 and out.strip() == "ran"
