"""How the suite is spread over pytest-xdist's workers (tests/conftest.py calls it; docs/architecture.md,
"Tests").

Two kinds of module:
- most keep a core busy (torch on tiny checkpoints, the command line, Qt): on two cores two workers
  run them, and the run takes about their CPU seconds halved;
- some mostly wait on the clock: the whole-app tests speak real-time audio into a virtual
  microphone and press keys on a virtual X display, the X and audio tests wait for servers and
  events. The day of dictation takes 107 s of which 60 s its core sat idle; such modules left a
  core idle about 200 s of a run.

With three workers or more (`pytest -n 3` on two cores) the last one is the *waiting lane*: it runs
every module of WAIT_MODULES, in one go, and nothing else; the others take the rest as before and
run at a lower priority (`os.nice`, CPU_LANE_NICE), so the app under test in the waiting lane gets
a core the moment it needs one (its timings are what its tests measure) and the CPU lanes take up
what it leaves. With one or two workers every module goes the usual way.

Within the CPU lanes: the longest modules first and the fast ones last (MODULE_SECONDS), see
`order`, and short hand-outs after the first blocks (`scheduler`)."""

from __future__ import annotations

import contextlib
import os

from tests import KEPT

# Seconds each module took under `pytest -n 2` on an idle 2-core machine (the sum of its items' times;
# modules under 2.5 s are left out and count as fast). Only the order depends on them: refresh them
# when a module's time changes much (`pytest -n 2 --durations=0`, summed per module).
MODULE_SECONDS = {
    "tests/e2e/test_day_e2e.py": 107,
    "tests/e2e/test_crash_recovery_e2e.py": 56,
    "tests/test_cli_train.py": 47,
    "tests/asr/test_fast_paths.py": 42,
    "tests/asr/test_convert.py": 37,
    "tests/test_bench.py": 30,
    "tests/oracle/test_oracle.py": 30,
    "tests/e2e/test_cold_start_e2e.py": 24,
    "tests/asr/test_gguf.py": 24,
    "tests/asr/test_generalise.py": 23,
    "tests/asr/test_variants.py": 23,
    "tests/asr/test_triton_fused.py": 21,
    "tests/asr/test_gguf_llama.py": 20,
    "tests/output/test_hold_x11_real.py": 20,
    "tests/app/test_streaming.py": 18,
    "tests/test_cli.py": 18,
    "tests/asr/test_parity.py": 18,
    "tests/e2e/test_app_e2e.py": 18,
    "tests/asr/test_weights.py": 17,
    "tests/app/test_controller.py": 17,
    "tests/app/test_settings_window.py": 16,
    "tests/asr/test_gguf_crispasr.py": 15,
    "tests/test_cli_limits.py": 14,
    "tests/app/test_durability.py": 13,
    "tests/asr/test_triton_gemv.py": 13,
    "tests/asr/test_lora.py": 13,
    "tests/asr/test_quant.py": 11,
    "tests/asr/test_streaming.py": 10,
    "tests/output/test_steps_real.py": 10,
    "tests/asr/test_buckets.py": 9,
    "tests/asr/test_adapters.py": 9,
    "tests/asr/test_engine.py": 9,
    "tests/hotkeys/test_x11_backend.py": 8,
    "tests/asr/test_draft.py": 8,
    "tests/output/test_x11_real.py": 8,
    "tests/test_packaging.py": 8,
    "tests/asr/test_compact.py": 8,
    "tests/asr/test_native_step.py": 7,
    "tests/app/test_ipc.py": 7,
    "tests/app/test_history_window.py": 7,
    "tests/audio/test_cue_echo.py": 6,
    "tests/app/test_second_launch.py": 6,
    "tests/app/test_cold_start.py": 6,
    "tests/asr/test_int8_table.py": 5,
    "tests/asr/test_compiled_step.py": 5,
    "tests/output/test_focus_real.py": 5,
    "tests/asr/test_vocabulary_parity.py": 5,
    "tests/asr/test_train.py": 5,
    "tests/asr/test_check_model_folder.py": 5,
    "tests/test_training.py": 4,
    "tests/audio/test_virtual_mic.py": 4,
    "tests/hotkeys/test_pynput_backend.py": 4,
    "tests/asr/test_prompt.py": 4,
    "tests/asr/test_inference_mode.py": 3,
    "tests/audio/test_sounds.py": 3,
    "tests/asr/test_limits.py": 3,
    "tests/output/test_wayland_real.py": 3,
    "tests/asr/test_triton_dequant.py": 3,
    "tests/output/test_hold.py": 3,
    "tests/test_imports.py": 3,
    "tests/audio/test_resample.py": 3,
    "tests/test_collection.py": 3,
    "tests/app/test_tray.py": 3,
    "tests/app/test_startup.py": 3,
}
DEALT_SECONDS = 20  # modules at least this long are dealt into the workers' first blocks
TAIL_CHUNK = 8  # items at most per hand-out after the first blocks (see `scheduler`)

# Modules whose items mostly wait on the clock: their process used under half of their wall time
# on CPU (its own and its children's, under `pytest -n 2`), e.g. the day of dictation 48 s of CPU
# in 109 s, the X keyboard hold 0.7 s in 20 s. test_app_e2e (11 s of CPU in 14 s) is not one.
WAIT_MODULES = frozenset(
    {
        "tests/e2e/test_day_e2e.py",
        "tests/e2e/test_crash_recovery_e2e.py",
        "tests/e2e/test_cold_start_e2e.py",
        "tests/output/test_hold_x11_real.py",
        "tests/app/test_durability.py",
        "tests/output/test_steps_real.py",
        "tests/hotkeys/test_x11_backend.py",
        "tests/output/test_x11_real.py",
        "tests/app/test_ipc.py",
        "tests/app/test_history_window.py",
        "tests/audio/test_cue_echo.py",
        "tests/app/test_second_launch.py",
        "tests/audio/test_virtual_mic.py",
        "tests/hotkeys/test_pynput_backend.py",
        "tests/output/test_wayland_real.py",
        "tests/audio/test_sounds.py",
        "tests/output/test_hold.py",
        "tests/output/test_focus.py",
        "tests/audio/test_portaudio.py",
        "tests/hotkeys/test_portal.py",
    }
)
CPU_LANE_NICE = 10  # the CPU lanes' niceness when a waiting lane runs: a tenth of its weight each


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def waiting_lane(workers: int, nodeids) -> bool:
    """True when the last of ``workers`` workers is the waiting lane for this collection."""
    return workers >= 3 and any(module_of(nodeid) in WAIT_MODULES for nodeid in nodeids)


def waiting_worker(workers: int) -> str:
    """The waiting lane's worker id (pytest-xdist's gw0, gw1, ...)."""
    return f"gw{workers - 1}"


def order(items: list, workers: int, maxschedchunk: int | None = None) -> list:
    """The same items, longest modules first and fast ones last (each module's items kept together
    and in order); with a waiting lane its modules first (the scheduler takes them out).

    pytest-xdist's default `--dist load` (3.8) first hands each of its W workers a block of
    N // W // 4 consecutive items (N collected; at most --maxschedchunk), then hands out the rest
    from the front as workers run low, in chunks of up to a quarter of what is left. So:
    - the modules of at least DEALT_SECONDS are dealt into W lanes of about equal seconds (the
      longest to the emptiest lane), and lane k is put at the start of block k, filled up with other
      items to the block's length: every worker starts on its share of them (a 105-s test that one
      worker started last kept the run waiting on it at the end);
    - the other modules follow, longest first, and the modules MODULE_SECONDS does not name (fast)
      come last: the last chunks, which no other worker can take over, are then quick to run (with
      the slow command-line modules last, one worker ran 36 of them for 43 s while the other waited).
    In one process (no workers) the same order runs. Every worker computes the same order from the
    same collection, as xdist requires."""
    waiting: list = []
    if waiting_lane(workers, (item.nodeid for item in items)):
        waiting = [item for item in items if module_of(item.nodeid) in WAIT_MODULES]
        items = [item for item in items if module_of(item.nodeid) not in WAIT_MODULES]
        waiting.sort(key=lambda item: MODULE_SECONDS.get(module_of(item.nodeid), 0), reverse=True)  # stable
        workers -= 1
    lanes: list[list] = [[] for _ in range(workers)]
    load = [0] * workers
    by_module: dict[str, list] = {}
    for item in items:
        by_module.setdefault(module_of(item.nodeid), []).append(item)
    modules = sorted(
        by_module, key=lambda m: MODULE_SECONDS.get(m, 0), reverse=True
    )  # stable: fast ones keep their order
    dealt = [m for m in modules if MODULE_SECONDS.get(m, 0) >= DEALT_SECONDS]
    rest = [item for m in modules if m not in dealt for item in by_module[m]]
    for module in dealt:
        k = load.index(min(load))
        lanes[k] += by_module[module]
        load[k] += MODULE_SECONDS[module]
    block = first_block(len(items), workers, maxschedchunk)
    ordered = []
    for k, lane in enumerate(lanes):
        take = max(0, (k + 1) * block - len(ordered) - len(lane)) if k < workers - 1 else 0
        ordered += lane + rest[:take]
        del rest[:take]
    return waiting + ordered + rest


def first_block(items: int, workers: int, maxschedchunk: int | None) -> int:
    """The items in each worker's first hand-out (as pytest-xdist's `--dist load` computes it)."""
    return max(2, min(items // workers // 4, maxschedchunk or items))


def scheduler(config, log):
    """pytest-xdist's `--dist load`, whose hand-outs after the first blocks are at most TAIL_CHUNK
    items (unless --maxschedchunk says otherwise), with the waiting lane where there is one.

    By default it hands a worker that runs low up to a quarter of the items left, and items once
    handed out stay with that worker: the run ended with one worker on a chunk of 251 items (45 s)
    while the other had nothing left. The first blocks keep their size, so the dealing of the long
    modules (`order`) still holds. The waiting lane's worker gets all its items at once and is then
    told that nothing more comes (it ends when they are done)."""
    from xdist.scheduler import LoadScheduling

    class Lanes(LoadScheduling):
        waiter = None  # the waiting lane's node, once scheduled

        def schedule(self) -> None:
            waiter = self._waiting_node() if self.collection is None else None
            if waiter is None:
                super().schedule()  # no waiting lane, or a later call: hands out what is left as below
            elif self._check_nodes_have_same_collection():
                self._first_hand_outs(waiter)
            else:
                self.log("**Different tests collected, aborting run**")  # as xdist's own says it
            self.maxschedchunk = min(self.maxschedchunk or TAIL_CHUNK, TAIL_CHUNK)

        def _waiting_node(self):
            """The waiting lane's node if this collection has one (collection_is_completed here)."""
            collection = next(iter(self.node2collection.values()))
            if not waiting_lane(self.numnodes, collection):
                return None
            return next((node for node in self.nodes if node.gateway.id == waiting_worker(self.numnodes)), None)

        def _first_hand_outs(self, waiter) -> None:
            self.collection = collection = self.node2collection[waiter]
            self.waiter = waiter
            waits = [i for i, nodeid in enumerate(collection) if module_of(nodeid) in WAIT_MODULES]
            self.pending[:] = [i for i, nodeid in enumerate(collection) if module_of(nodeid) not in WAIT_MODULES]
            self.node2pending[waiter].extend(waits)
            waiter.send_runtest_some(waits)
            waiter.shutdown()
            others = [node for node in self.nodes if node is not waiter]
            block = first_block(len(self.pending), len(others), self.maxschedchunk)
            for node in others:
                self._send_tests(node, block)
            if not self.pending:
                for node in others:
                    node.shutdown()

        def check_schedule(self, node, duration: float = 0) -> None:
            if node is not self.waiter:  # the waiting lane has all it will get
                super().check_schedule(node, duration)

    return Lanes(config, log)


def lane_here() -> str | None:
    """ "cpu" or "waiting" in a pytest-xdist worker of a run with three workers or more, else None."""
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or workers < 3:
        return None
    return "waiting" if worker == waiting_worker(workers) else "cpu"


def nice_cpu_lane() -> None:
    """In a pytest-xdist worker of a run with a waiting lane: a CPU lane runs at CPU_LANE_NICE."""
    if lane_here() == "cpu":
        os.nice(CPU_LANE_NICE)


# The lock file of `one_big_child_at_a_time`: every worker of a run (and any other run in this checkout)
# sees it.
BIG_CHILD_LOCK = KEPT / "big-child.lock"


@contextlib.contextmanager
def one_big_child_at_a_time():
    """Held while a test runs a child process that imports the official stack (torch and transformers:
    the transformers-5 reference, llama.cpp's converter, each 350-450 MB for a few seconds); another
    worker's such child waits until it ends. Two of them at once, beside the app of an e2e test in the
    waiting lane, made the highest used memory of a fresh clone's run (3.5 GiB above idle)."""
    try:
        import fcntl
    except ImportError:  # Windows has no flock: the children run as they come
        yield
        return
    BIG_CHILD_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(BIG_CHILD_LOCK, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield
