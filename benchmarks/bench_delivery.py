"""From the release of the hotkey to the moment typing starts, through the whole app controller.

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_delivery.py [--takes 10] [--locked]

The controller runs as in the app (worker threads, a real SQLite history on disk, the tiny random
test checkpoint on the CPU); only the microphone, the typing tool and the hotkey listener are the
test fakes (tests/app/controller_fakes.py). Streaming is off, so each take is transcribed after
the release. Per take it reports release -> typing starts, transcript ready -> typing starts (the
part the history write is in: stored before typed), and the longest the GUI thread went without
running a 10-ms timer. ``--locked``: another process holds the history's write lock meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from dictation.asr import AsrEngine  # noqa: E402
from dictation.config import Settings  # noqa: E402
from dictation.session import Status  # noqa: E402
from tests.app.controller_fakes import FakeChain  # noqa: E402
from tests.app.rig import Rig, speech  # noqa: E402
from tests.oracle.checkpoints import cached_checkpoint  # noqa: E402

LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


class Bot:
    """The part of pytest-qt's qtbot the rig uses."""

    def __init__(self, app: QApplication) -> None:
        self.app = app

    def waitUntil(self, condition, timeout: int = 5000) -> None:  # noqa: N802 (qtbot's name)
        end = time.monotonic() + timeout / 1000
        while not condition():
            if time.monotonic() > end:
                raise TimeoutError("condition not met")
            self.app.processEvents()
            time.sleep(0.001)

    def wait(self, ms: int) -> None:
        end = time.monotonic() + ms / 1000
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.001)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--takes", type=int, default=10)
    p.add_argument("--seconds", type=float, default=2.0, help="length of each take")
    p.add_argument("--locked", action="store_true", help="another process holds the history's write lock")
    args = p.parse_args()

    app = QApplication.instance() or QApplication(sys.argv[:1])
    work = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    ckpt = cached_checkpoint(work / "ckpt", tie_word_embeddings=False)
    marks: dict[str, float] = {}

    class Timed(AsrEngine):
        def transcribe(self, *a, **k):
            result = super().transcribe(*a, **k)
            marks["transcript"] = time.monotonic()
            return result

    class TimedChain(FakeChain):
        def deliver(self, text):
            marks["typing"] = time.monotonic()
            return super().deliver(text)

    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt), device="cpu", stream_while_recording=False)
    )
    bot = Bot(app)
    rig = Rig(bot, work / "app", settings, engine_factory=Timed, chain=TimedChain())
    rig.start()
    rig.wait_status(Status.IDLE, 60_000)
    locker = None
    if args.locked:
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(work / "app" / "history.sqlite3")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert locker.stdout.readline().strip() == "locked"
    gaps = {"last": time.monotonic(), "longest": 0.0}

    def tick() -> None:
        now = time.monotonic()
        gaps["longest"] = max(gaps["longest"], now - gaps["last"])
        gaps["last"] = now

    timer = QTimer()
    timer.timeout.connect(tick)
    release_to_typing, transcript_to_typing, gui = [], [], []
    try:
        for i in range(args.takes):
            audio = speech(args.seconds, seed=10 + i)
            rig.hold(audio)
            gaps["last"], gaps["longest"] = time.monotonic(), 0.0
            timer.start(10)
            t_release = time.monotonic()
            rig.release(audio)
            try:
                bot.waitUntil(lambda n=i: len(rig.chain.delivered) > n, 30_000)
            except TimeoutError:
                print(f"take {i + 1}: nothing typed within 30 s; the GUI thread stalled for {gaps['longest']:.1f} s")
                break
            timer.stop()
            release_to_typing.append(marks["typing"] - t_release)
            transcript_to_typing.append(marks["typing"] - marks["transcript"])
            gui.append(gaps["longest"])
            rig.wait_status(Status.IDLE, 30_000)
            bot.wait(100)
    finally:
        if locker is not None:
            locker.stdin.close()
            locker.wait(10)
        rig.close()

    def ms(values: list[float]) -> str:
        if not values:
            return "-"
        return f"median {statistics.median(values) * 1000:7.1f} ms, max {max(values) * 1000:7.1f} ms"

    print(f"takes typed: {len(release_to_typing)} of {args.takes}{' (history locked)' if args.locked else ''}")
    print(f"release -> typing starts:    {ms(release_to_typing)}")
    print(f"transcript -> typing starts: {ms(transcript_to_typing)}")
    print(f"GUI thread longest stall:    {ms(gui)}")


if __name__ == "__main__":
    main()
