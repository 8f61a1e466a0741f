"""Measurement, not a test (no test_ prefix: run it by name). The back-to-back race on purpose: each
text goes out and the next take's chord goes down 0-SPREAD s later, mostly into the paste itself.

    PYTHONPATH=$PWD python -m pytest -q -s tests/output/measure_back_to_back.py   # TAKES=40 SEED=25 SPREAD=0.25

prints per run (with the hold, and as before without it) the texts lost, duplicated and stray keys.
"""

import os
import random
import re
import threading
import time

import pytest

from dictation.output import OutputOptions, choose_backend
from tests.output import test_hold_x11_real as real
from tests.output.test_hold_x11_real import CHORD_DOWN, CHORD_UP, xdotool

hotkeys = real.hotkeys  # the fixture: the real x11 backend feeding the hold

N = int(os.environ.get("TAKES", "40"))


@pytest.mark.parametrize("guarded", [True, False])
def test_measure(xvfb, target, xclipboard, hotkeys, guarded):
    hold, backend = hotkeys
    chain = choose_backend(OutputOptions(restore_delay_ms=3_600_000), xvfb, hold=hold if guarded else None)
    rng = random.Random(int(os.environ.get("SEED", "25")))
    texts = [f"t{i:02d} " for i in range(N)]
    for text in texts:
        sender = threading.Thread(target=lambda t=text: chain.deliver(t))
        sender.start()
        time.sleep(rng.uniform(0.0, float(os.environ.get("SPREAD", "0.25"))))
        xdotool(xvfb, *CHORD_DOWN)
        time.sleep(rng.uniform(0.1, 0.4))
        xdotool(xvfb, *CHORD_UP)
        sender.join(15)
    time.sleep(1.5)
    got = target.text()
    found = re.findall(r"t\d\d", got)
    lost = [t.strip() for t in texts if t.strip() not in found]
    dup = len(found) - len(set(found))
    order = found == sorted(found)
    extra = len(re.sub(r"t\d\d ", "", got))
    counts = f"lost={len(lost)} {lost} duplicated={dup} in_order={order} stray_chars={extra}"
    print(f"\nMEASURE guarded={guarded} takes={N} {counts}")
    chain.flush()
