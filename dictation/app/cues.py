"""`Cues`: the sound cues the session asks for (start, stop, cancel, error), for the controller: the
player made from the settings at start, changed live, closed at quit. A cue the microphone hears
is muted in the take (the player reports it: `dictation.audio.cue_echo`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dictation.config import Settings


class Cues:
    def __init__(self, factory: Callable[[Settings], Any] | None, mark_cue: Callable[..., None]) -> None:
        self._factory = factory  # settings -> an object with play(kind); None: the real SoundPlayer
        self._mark_cue = mark_cue  # the audio worker's: where a cue sounded, for the take
        self.player: Any = None

    def start(self, settings: Settings) -> None:
        self.player = self._make(settings)

    def play(self, kind: str) -> None:
        if self.player is not None:
            self.player.play(kind)

    def update(self, settings: Settings) -> None:
        r = settings.recording
        if hasattr(self.player, "volume") and hasattr(self.player, "enabled"):
            self.player.volume, self.player.enabled = r.sound_volume, r.sounds
        else:
            self.player = self._make(settings)

    def close(self) -> None:
        close = getattr(self.player, "close", None)
        if close is not None:
            close()

    def _make(self, settings: Settings) -> Any:
        if self._factory is not None:
            player = self._factory(settings)
        else:
            from dictation.audio.sounds import SoundPlayer

            player = SoundPlayer(volume=settings.recording.sound_volume, enabled=settings.recording.sounds)
        if hasattr(player, "on_cue"):  # a cue the microphone hears is muted in the take (audio.cue_echo)
            player.on_cue = self._mark_cue
        return player
