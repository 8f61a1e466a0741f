"""Shared fixtures: a private home for every test, tiny random checkpoints (built once per session)
and engines on them (docs/architecture.md, "Tests")."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import linecache
import os
import shutil
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest

from tests import KEPT, lanes

# OpenMP's threads (torch's intra-op pool) wait for work by spinning, by default for a while before
# they sleep. The processes the tests start (the app, the command line, the official implementation
# in transformers 5) keep torch's default of one thread per core, while the suite's workers keep
# those cores busy: a thread that spins while the one it waits for is not running takes the core
# its partner needs. `dictation bench` on the tiny model beside two busy cores: 18.3 s of CPU and
# 20.4 s of wall time spinning, 4.7 s and 6.7 s waiting passively (4.8 s of CPU on an idle machine).
# Set before torch is imported here, and inherited by every process the tests start: what they
# compute does not change, only how their threads wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Triton's compiled kernels are kept between runs in the checkout's pytest cache, as its converter
# download is (tests/oracle/llama_cpp.py): by default Triton keeps them under $HOME/.triton, and
# every test and the session run with homes of their own (`session_home`, `private_home`), so each
# run compiled them all again (the three Triton modules: 41 s of CPU with the kept kernels, 64 s
# without). Triton keys each entry by the kernel's source, its compiler and options, and writes
# entries atomically, so the workers share the folder. A fresh checkout (CI) compiles them all.
os.environ.setdefault("TRITON_CACHE_DIR", str(KEPT / "triton"))


@contextlib.contextmanager
def collector_paused():
    """Python's automatic garbage collection off for a while, and on again after if it was on.

    Collecting the suite allocates millions of short-lived objects (pytest rewrites each test module's
    asserts as a syntax tree of its own) while torch, Qt and thousands of test items are alive, and
    every automatic full collection walks them all. Paused, `pytest --collect-only` of the whole suite
    took 15 s instead of 22 s on 2 cores where Python writes no bytecode (PYTHONDONTWRITEBYTECODE=1,
    so pytest rewrites every test module again), and about 0.5 s less where it does."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    with collector_paused():  # the tests themselves run with it on (collector_given_back)
        result = yield
    # What is alive now (torch, Qt, the modules, thousands of test items) stays alive for the whole run:
    # moved out of the collector's sight, so that each full collection during the run (the app tests
    # collect after every test: tests/app/conftest.py) no longer walks it. That took 0.35-0.54 s per
    # app test with the whole suite loaded. Reference counting still frees these objects.
    gc.collect()
    gc.freeze()
    if "PySide6" in sys.modules:  # Qt tests to run: on Python < 3.12 with a PySide6 that drops references
        from dictation.app import qt_refs  # to None and True per call, the app's own guard (its start has it)

        qt_refs.guard()
    return result


# Modules (their node ids) that froze what was alive when their first Qt test began (`frozen_for_module`).
_frozen_in: set[str] = set()


def frozen_for_module(item) -> None:
    """Before the first Qt test of ``item``'s module: a full collection, then what is alive moved out
    of the collector's sight (``gc.freeze``), as after collection (`pytest_collection`).

    The Qt tests collect at each test's end (tests/app/conftest.py), and a full collection walks every
    object the process made since the last freeze: 0.12-0.15 s per Qt test, 43 s of the 149 s that
    tests/app took in one process, most of it walking what earlier modules left alive (modules
    imported on the way, caches). Frozen at the module's start, each test's collection walks what the
    module made; a cycle among the older objects that the module drops waits until its end
    (`pytest_runtest_teardown`). (Freezing after each test instead also froze what Qt deletes on the
    next test's events, a controller and its engine each time: a worker grew 0.7 GB over
    tests/app/test_streaming.py.)"""
    module = item.nodeid.split("::")[0]
    if module in _frozen_in:
        return
    with collector_paused():
        gc.collect()
        gc.freeze()
    _frozen_in.add(module)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test on this worker (the next item belongs to another module) and its
    module fixtures' teardown:
    - the source lines read from files are forgotten (``linecache``). Once PySide6 is imported, its
      import hook reads the whole source of every module imported after it (``inspect.getsource``, to
      see whether it names PySide6), and ``linecache`` keeps every line: about 120 MB of strings per
      worker by the end of a run. Lines registered without a file (code that torch generates) stay;
      the others are read again when a traceback needs them;
    - the kept engines and official models are dropped if the next test does not ask for
      `engine_factory` (`release_models`): kept through the tests that share them, they no longer
      stay for the rest of the run. With them the worker's free heap is given back (`malloc_trim`);
    - what the module froze (`frozen_for_module`), or everything if models were dropped, is unfrozen
      and collected, and what survives is frozen again."""
    result = yield
    module = item.nodeid.split("::")[0]
    if nextitem is not None and nextitem.nodeid.split("::")[0] == module:
        return result
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is not None:  # (size, mtime, lines, path): read from a file
            linecache.cache.pop(name, None)
    released = not models_wanted_next(nextitem) and release_models()
    if module in _frozen_in or released:
        _frozen_in.discard(module)
        with collector_paused():  # no automatic collection on another thread between these calls
            gc.unfreeze()
            gc.collect()
            gc.freeze()
    if released:
        heap_given_back()
    return result


def heap_given_back() -> None:
    """glibc's free heap returned to the system (``malloc_trim``); nothing where the C library lacks it."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def pytest_unconfigure(config):
    """Everything frozen is given back to the collector before the interpreter exits: its last
    collection frees it (frozen, nanobind's objects in Triton were reported as leaked at exit)."""
    gc.unfreeze()


@pytest.hookimpl(trylast=True)  # after -k/-m/--deselect and pytest's own fixture-scope reordering
def pytest_collection_modifyitems(config, items):
    """The order in which the workers get the items: tests/lanes.py, `order`."""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = lanes.order(items, workers, config.getoption("maxschedchunk", None))


def pytest_xdist_make_scheduler(config, log):
    """tests/lanes.py, `scheduler` (xdist's own where another --dist or a --maxschedchunk is asked for)."""
    if config.getvalue("dist") != "load" or config.getoption("maxschedchunk", None):
        return None
    return lanes.scheduler(config, log)


# torch before any test imports PySide6: with PySide6 loaded first and torch later (the app's engine
# thread), the interpreter aborted at exit in its final collection ("bool_dealloc: deallocating True
# or False"), e.g. `pytest tests/app/test_startup.py` alone (exit 134 after every test passed).
# Most likely PySide6 6.12.0 on Python 3.11: each `Signal.emit()` loses a reference to True (each Qt
# call returning nothing one to None), and torch imported first only adds some 10,000 references to
# True. `qt_refs.guard` after collection (above) now pins them. (Today test_startup.py alone exits 0
# even without torch first and without the guard.)


def import_torch_first() -> None:
    """torch first (above), where tests run; pytest_configure calls it, but not in pytest-xdist's
    controller, which only hands out the items (torch and the official package held some 150 MB there)."""
    with collector_paused():
        import tests.oracle.checkpoints  # noqa: F401


def xdist_controller(config) -> bool:
    """True in the process that runs pytest-xdist's workers (not in a worker, nor in a run without them)."""
    return bool(config.getoption("numprocesses", None)) and not os.environ.get("PYTEST_XDIST_WORKER")


# Under pytest-xdist each worker's torch runs on one thread (the processes the tests start keep their
# own defaults). The tiny checkpoints' operators are too small to share: two workers on two cores, each
# with two threads, spent much of their time spinning while an operator's threads waited for each
# other (the training tests: a quarter of their CPU time on one thread, see one_torch_thread).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)

# glibc's malloc in the pytest-xdist workers (read once, when a process starts): blocks from 1 MiB up
# are mapped on their own and unmapped when freed, and two arenas serve all threads. By default the
# mapping threshold rises to 32 MiB after the first large free, and the tiny checkpoints' buffers
# (0.3-30 MiB) then went to the heap and stayed there as fragments: the workers grew to 2.2 GB each.
# Those mappings are asked for as transparent huge pages (glibc.malloc.hugetlb=1, where the kernel
# offers them on request): each mapped block was otherwise touched in 4 KiB pages, one page fault
# each, 11.7 million faults for test_fast_paths, test_parity and test_quant under -n 2, and 2.6 million
# with it (62 s -> 53 s). The workers take these from the controller and drop them, so the processes
# the tests start (the app, the command line) run with glibc's defaults, as users' do.
WORKER_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "1048576",
    "MALLOC_ARENA_MAX": "2",
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
}
WORKER_MALLOC_FLAG = "DICTATION_TESTS_WORKER_MALLOC"


@pytest.hookimpl(tryfirst=True)  # before pytest-qt's, which imports PySide6
def pytest_configure(config):
    if not xdist_controller(config):
        import_torch_first()
        return
    for name, value in WORKER_MALLOC.items():
        if name not in os.environ:
            os.environ[name] = value
            os.environ[WORKER_MALLOC_FLAG] = os.environ.get(WORKER_MALLOC_FLAG, "") + f" {name}"


for _name in os.environ.pop(WORKER_MALLOC_FLAG, "").split() if os.environ.get("PYTEST_XDIST_WORKER") else ():
    os.environ.pop(_name, None)
lanes.nice_cpu_lane()  # with a waiting lane (pytest -n 3 or more): see tests/lanes.py


# Where the suite's short folders go: Unix socket paths hold at most 107 bytes, and pytest-xdist's
# temporary folders (/tmp/pytest-of-<user>/pytest-<n>/popen-gw<k>/<test name>0/...) go past that.
SHORT_BASE = "/tmp"

ENGINES_KEPT = 2  # engines the session keeps warm; more held every test's engine (13 GB by the end)


def short_dir(prefix: str = "dt-") -> Path:
    """A new private (0700) folder with a short path, for Unix sockets; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SHORT_BASE))


@pytest.fixture
def short_tmp():
    """A private folder of this test with a path short enough for Unix sockets (see short_dir)."""
    folder = short_dir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def point_home_at(monkeypatch, home: Path, runtime: Path) -> None:
    """HOME, the XDG folders, DICTATION_HOME and the Hugging Face folders into ``home``, the runtime
    folder (sockets, locks) at ``runtime``."""
    for name, folder in {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_RUNTIME_DIR": runtime,
        "DICTATION_HOME": home / "app-home",  # not named "dictation": paths.private_folders
        "HF_HOME": home / ".cache" / "huggingface",
    }.items():
        monkeypatch.setenv(name, str(folder))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """The whole session's home, before any other session or module fixture is set up (pytest sets
    up autouse fixtures first within a scope, and wider scopes before narrower ones).

    A session fixture that starts a server copies the environment once (the X server's, sway's and
    PulseAudio's clients get that copy), and it was set up before the first test's `private_home`:
    the copy named the user's own HOME and no runtime folder, and `dictation toggle` run with it made
    its socket folder in the user's own ~/.cache/dictation (tests/test_isolation.py)."""
    runtime = short_dir("dtses-")
    with pytest.MonkeyPatch.context() as monkeypatch:
        point_home_at(monkeypatch, tmp_path_factory.mktemp("session-home"), runtime)
        yield
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory, monkeypatch):
    """Every test runs in a home of its own: HOME, the XDG folders, DICTATION_HOME and the Hugging
    Face folders point into this test's temporary folder, the runtime folder (sockets, locks) into
    a short private one (`point_home_at`). Nothing a test runs (nor the processes it starts) reaches
    the user's own ~/.cache/dictation, ~/.config or Hugging Face cache (tests/test_isolation.py checks
    it); what session fixtures set up before it sees the session's own home (`session_home`)."""
    home = tmp_path_factory.mktemp("home", numbered=True)
    runtime = short_dir("dtrun-")
    point_home_at(monkeypatch, home, runtime)
    yield home
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def home(private_home):
    """This test's home folder (HOME), with the XDG folders in it."""
    return private_home


@pytest.fixture
def dictation_home(private_home):
    """This test's DICTATION_HOME: the app's config/, data/ and log/ go there."""
    return Path(os.environ["DICTATION_HOME"])


@pytest.fixture(autouse=True)
def collector_given_back():
    """A test that started the app's worker threads stopped them: Python collects by itself again
    (dictation/app/gui_gc.py turns automatic collection off while they run)."""
    yield
    if not gc.isenabled():
        from dictation.app import gui_gc

        while gui_gc.active():
            gui_gc.release()
        gc.enable()
        pytest.fail("the test left worker threads running: automatic garbage collection stayed off")


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    """Where the session's checkpoints are built: under pytest-xdist one folder for all workers
    (``cached_checkpoint`` builds atomically, so the first worker's build serves the others)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "checkpoints"
        root.mkdir(exist_ok=True)
        return root
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def ckpt_untied(ckpt_root):
    from tests.oracle.checkpoints import cached_checkpoint  # torch: imported when a test needs it

    return cached_checkpoint(ckpt_root, tie_word_embeddings=False)


@pytest.fixture(scope="session")
def ckpt_tied(ckpt_root):
    from tests.oracle.checkpoints import cached_checkpoint

    return cached_checkpoint(ckpt_root, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def ckpt_stops(ckpt_root):
    """A checkpoint whose model ends its output after a few tokens."""
    from tests.oracle.checkpoints import EOS_BIAS_EARLY_STOP, cached_checkpoint

    return cached_checkpoint(ckpt_root, tie_word_embeddings=False, eos_bias=EOS_BIAS_EARLY_STOP)


@pytest.fixture
def short_pattern_deadline(monkeypatch):
    """The regular-expression matcher's deadline at 1.5 s instead of the app's 3 s, for tests that
    wait for it to pass: its child spins on a core until it is killed (dictation/asr/tune/patterns.py)."""
    from dictation.asr.tune import patterns

    monkeypatch.setattr(patterns, "TIMEOUT_S", 1.5)


@pytest.fixture
def one_torch_thread():
    """torch's operators on one thread for the test, as they were before after it.

    The tiny checkpoints' operators are too small for two threads to share: with the suite on two
    workers on two cores (or any other load), each operator's threads waited for each other,
    spinning, and the training tests spent most of their CPU time so (test_deterministic_with_seed:
    about 40 s of wall time against 9 s on one thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class KeptEngines:
    """CPU engines by (folder, dtype), the last ENGINES_KEPT of them kept for the tests that follow
    (the session's `engine_factory`); `release_models` drops them at a module's end when the next
    module does not ask for them.

    Many tests build an engine on a folder of their own (a copy of a checkpoint in tmp_path): a cache
    that kept them all held every engine of the session, about 13 GB at the end of a full run."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.engines: OrderedDict[tuple[str, str], object] = OrderedDict()

    def __call__(self, folder, dtype="fp32"):
        key = (str(folder), dtype)
        if key in self.engines:
            self.engines.move_to_end(key)
        else:
            from dictation.asr import AsrEngine, EngineOptions

            engine = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype=dtype))
            engine.prepare()
            self.engines[key] = engine
            while len(self.engines) > self.kept:
                self.engines.popitem(last=False)  # the tests that had it keep their own reference
        return self.engines[key]


_kept_engines = KeptEngines(ENGINES_KEPT)


@pytest.fixture(scope="session")
def engine_factory():
    """`KeptEngines`: ``engine_factory(folder, dtype="fp32")`` is a prepared CPU engine on ``folder``."""
    yield _kept_engines
    _kept_engines.engines.clear()


def models_wanted_next(nextitem) -> bool:
    """Whether the test after a module's last one asks for the kept engines (`engine_factory`)."""
    return nextitem is not None and "engine_factory" in nextitem.fixturenames


def release_models() -> bool:
    """The session's kept engines (`engine_factory`) and official models (tests/oracle/official.py)
    dropped; True if there were any."""
    held = bool(_kept_engines.engines)
    _kept_engines.engines.clear()
    official = sys.modules.get("tests.oracle.official")
    if official is not None:
        held = held or official.oracles_kept() > 0
        official.drop_oracles()
    return held
