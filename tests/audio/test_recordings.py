"""Takes saved before transcription, under unique timestamped names, with old ones pruned."""

from __future__ import annotations

import os
import re
import stat
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from dictation.audio.recordings import list_recordings, prune_recordings, save_recording
from dictation.audio.wav import read_wav

T0 = datetime(2026, 1, 21, 14, 30, 15, 123456, tzinfo=timezone.utc)


def tone(seconds: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_saved_into_recordings_dir_with_a_timestamped_name(dictation_home):
    audio = tone()
    path = save_recording(audio, now=T0)
    assert path.parent == dictation_home / "data" / "recordings"
    assert path.name == "rec-20260121T143015.123Z.wav"
    samples, rate = read_wav(path)
    assert rate == 16000
    np.testing.assert_allclose(samples, audio, atol=1 / 32768)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # recordings are private
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left


def test_names_are_unique_within_the_same_millisecond(dictation_home):
    paths = [save_recording(tone(0.1), now=T0) for _ in range(3)]
    assert [p.name for p in paths] == [
        "rec-20260121T143015.123Z.wav",
        "rec-20260121T143015.123Z-2.wav",
        "rec-20260121T143015.123Z-3.wav",
    ]
    assert list_recordings() == paths  # in time order, suffixes included


def test_local_times_are_named_in_utc(dictation_home):
    local = T0.astimezone(timezone(timedelta(hours=-5)))
    assert save_recording(tone(0.1), now=local).name == "rec-20260121T143015.123Z.wav"


def test_keep_n_deletes_only_our_oldest_files(dictation_home):
    folder = dictation_home / "data" / "recordings"
    folder.mkdir(parents=True)
    foreign = ["notes.txt", "rec-mine.wav", "my-take.wav", "rec-20200101T000000.000Z.wav.bak"]
    for name in foreign:
        (folder / name).write_text("user's file")
    saved = [save_recording(tone(0.1), now=T0 + timedelta(seconds=i), keep=3) for i in range(5)]
    assert list_recordings() == saved[-3:]
    assert sorted(p.name for p in folder.iterdir()) == sorted(foreign + [p.name for p in saved[-3:]])


def test_the_new_recording_survives_pruning_even_if_the_clock_went_back(dictation_home):
    newer = save_recording(tone(0.1), now=T0 + timedelta(days=1))
    back_in_time = save_recording(tone(0.1), now=T0, keep=1)
    assert list_recordings() == [back_in_time, newer]  # the take about to be transcribed is never deleted


def test_prune_and_validation(dictation_home, tmp_path):
    folder = tmp_path / "elsewhere"
    saved = [save_recording(tone(0.05), directory=folder, now=T0 + timedelta(minutes=i)) for i in range(4)]
    assert prune_recordings(2, directory=folder) == saved[:2]
    assert list_recordings(folder) == saved[2:]
    assert list_recordings(tmp_path / "missing") == []
    with pytest.raises(ValueError, match="at least 1"):
        save_recording(tone(0.05), directory=folder, keep=0)
    with pytest.raises(ValueError, match="at least 1"):
        prune_recordings(0, directory=folder)


def test_a_failed_write_leaves_no_file(dictation_home, monkeypatch):
    from dictation.audio import recordings

    def broken(path, samples, rate):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(recordings, "write_wav", broken)
    with pytest.raises(OSError, match="No space left"):
        save_recording(tone(0.05), now=T0)
    assert list_recordings() == []


def test_name_pattern_is_filesystem_safe(dictation_home):
    name = save_recording(tone(0.05)).name
    assert re.fullmatch(r"rec-\d{8}T\d{6}\.\d{3}Z\.wav", name)
    assert os.sep not in name and ":" not in name  # valid on Windows too


# ---- takes written while they are recorded --------------------------------------------------------


def test_a_take_file_is_a_complete_wav_after_every_append_and_finish_replaces_it_whole(dictation_home):
    from dictation.audio.recordings import TakeFile

    take = TakeFile.create(48_000, now=T0)
    assert take.path == dictation_home / "data" / "recordings" / "rec-20260121T143015.123Z.wav"
    assert stat.S_IMODE(take.path.stat().st_mode) == 0o600
    written = []
    for seconds in (0.5, 0.5, 0.25):
        chunk = tone(seconds)
        take.append(chunk)
        written.append(chunk)
        samples, rate = read_wav(take.path)  # a player (or the app after a crash) reads it as it is
        assert rate == 48_000
        np.testing.assert_allclose(samples, np.concatenate(written), atol=1 / 32768)
    assert list_recordings() == [take.path]  # pruning counts it, under the name the take keeps
    final = tone(0.8)
    assert take.finish(final, 16_000) == take.path
    samples, rate = read_wav(take.path)
    assert rate == 16_000
    np.testing.assert_allclose(samples, final, atol=1 / 32768)
    assert stat.S_IMODE(take.path.stat().st_mode) == 0o600
    assert [p.name for p in take.path.parent.iterdir()] == [take.path.name]  # no temp files left
    with pytest.raises(ValueError, match="closed"):
        take.append(tone(0.1))


def test_a_discarded_take_file_is_gone(dictation_home):
    from dictation.audio.recordings import TakeFile

    take = TakeFile.create(now=T0)
    take.append(tone(0.1))
    take.discard()
    assert list_recordings() == []


_WRITER = """
import sys, time
import numpy as np
from dictation.audio.recordings import TakeFile
take = TakeFile.create(16000, directory=sys.argv[1])
print(take.path, flush=True)
rng = np.random.default_rng(3)
n = 0
while True:
    chunk = (rng.standard_normal(8000) * 0.1).astype(np.float32)  # 0.5 s, as the app appends
    take.append(chunk)
    n += len(chunk)
    print(n, flush=True)
    time.sleep(0.02)
"""


def test_kill_9_while_a_take_is_written_keeps_everything_appended(tmp_path):
    """A real process appending as the app does, killed with SIGKILL mid-take: the file holds every
    sample appended before the kill, as a WAV any reader opens."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    path = proc.stdout.readline().strip()
    appended = 0
    for _ in range(6):
        appended = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    rest = proc.stdout.read().split()
    appended = int(rest[-1]) if rest else appended  # appends reported after the sixth, before the kill
    samples, rate = read_wav(path)
    assert rate == 16_000
    assert len(samples) >= appended  # nothing reported as appended was lost (maybe one more chunk)
    assert len(samples) % 8000 == 0 and len(samples) <= appended + 8000
    rng = np.random.default_rng(3)  # the writer's chunks, drawn again in the same order
    expected = np.concatenate(
        [(rng.standard_normal(8000) * 0.1).astype(np.float32) for _ in range(len(samples) // 8000)]
    )
    np.testing.assert_allclose(samples, np.clip(expected, -1, 1), atol=1 / 32768)


def test_pruning_never_deletes_a_protected_recording(dictation_home):
    saved = [save_recording(tone(0.05), now=T0 + timedelta(minutes=i)) for i in range(5)]
    deleted = prune_recordings(2, protect={saved[0], saved[2]})
    assert deleted == [saved[1]]
    assert list_recordings() == [saved[0], saved[2], saved[3], saved[4]]


# ---- a link in place of the recordings folder ------------------------------------------------------


def _linked_recordings(dictation_home, mode: int):
    target = dictation_home / "elsewhere" / "recs"
    target.mkdir(parents=True)
    target.chmod(mode)
    (dictation_home / "data").mkdir(parents=True, exist_ok=True)
    (dictation_home / "data" / "recordings").symlink_to(target)
    return target


@pytest.mark.parametrize("writer", ["take file", "save"])
def test_a_linked_recordings_folder_others_can_open_is_refused(dictation_home, writer):
    """The fault run: a symlinked recordings folder was followed while its target stayed 0755."""
    from dictation.audio.recordings import TakeFile

    target = _linked_recordings(dictation_home, 0o755)
    with pytest.raises(PermissionError) as refused:
        if writer == "take file":
            TakeFile.create(now=T0)
        else:
            save_recording(tone(), now=T0)
    assert str(refused.value) == (
        f"{dictation_home / 'data' / 'recordings'} is a link to {target}, which other users can open (mode 755); "
        f"not writing recordings there: make it private (chmod 700 {target}) or remove the link"
    )
    assert list(target.iterdir()) == [] and stat.S_IMODE(os.stat(target).st_mode) == 0o755  # untouched


def test_a_linked_recordings_folder_of_the_users_alone_is_used(dictation_home):
    from dictation.audio.recordings import TakeFile

    target = _linked_recordings(dictation_home, 0o700)
    take = TakeFile.create(now=T0)
    take.append(tone(0.1))
    take.close()
    assert [p.name for p in target.iterdir()] == [take.path.name]
    assert stat.S_IMODE(os.stat(take.path).st_mode) == 0o600


def test_a_take_file_tightens_a_real_recordings_folder(dictation_home):
    from dictation.audio.recordings import TakeFile

    folder = dictation_home / "data" / "recordings"
    folder.mkdir(parents=True, mode=0o755)
    folder.chmod(0o755)
    TakeFile.create(now=T0).discard()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
