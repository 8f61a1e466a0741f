"""The x11 hotkey backend's connection, and XkbSetDetectableAutoRepeat: two XKB requests python-xlib lacks.

With detectable auto-repeat, a held key repeats as presses only, without the fake release before
each one, so a held chord is one press and one release (`x11_backend`).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

XKB_USE_CORE_KBD = 0x100
XKB_PCF_DETECTABLE_AUTO_REPEAT = 1


def connect(target: str | None) -> Any:
    """A python-xlib connection to ``target`` without its protocol-extension modules.

    python-xlib's `Display` asks the server about each of the fifteen extensions it knows (a round
    trip each) and imports their modules: half of the time to the hotkey grab at launch
    (`dictation.launch`). Grabs, key events, the keymap and XKB (asked for directly in
    `set_detectable_auto_repeat`) need none of them. The extension list is left empty while the
    connection is set up, for this connection only."""
    import Xlib.display

    class Connection(Xlib.display.Display):
        _setting_up = True

        def list_extensions(self) -> list[str]:
            return [] if self._setting_up else super().list_extensions()

    display = Connection(target)
    display._setting_up = False
    return display


def _xkb_requests() -> tuple[type, type]:
    """The two XKB requests python-xlib lacks: UseExtension and PerClientFlags (XKBproto.h)."""
    from Xlib.protocol import rq

    class UseExtension(rq.ReplyRequest):
        _request = rq.Struct(
            rq.Card8("opcode"),
            rq.Opcode(0),
            rq.RequestLength(),
            rq.Card16("wanted_major"),
            rq.Card16("wanted_minor"),
        )
        _reply = rq.Struct(
            rq.ReplyCode(),
            rq.Bool("supported"),
            rq.Card16("sequence_number"),
            rq.ReplyLength(),
            rq.Card16("server_major"),
            rq.Card16("server_minor"),
            rq.Pad(20),
        )

    class PerClientFlags(rq.ReplyRequest):
        _request = rq.Struct(
            rq.Card8("opcode"),
            rq.Opcode(21),
            rq.RequestLength(),
            rq.Card16("device_spec"),
            rq.Pad(2),
            rq.Card32("change"),
            rq.Card32("value"),
            rq.Card32("ctrls_to_change"),
            rq.Card32("auto_ctrls"),
            rq.Card32("auto_ctrl_values"),
        )
        _reply = rq.Struct(
            rq.ReplyCode(),
            rq.Card8("device_id"),
            rq.Card16("sequence_number"),
            rq.ReplyLength(),
            rq.Card32("supported"),
            rq.Card32("value"),
            rq.Card32("auto_ctrls"),
            rq.Card32("auto_ctrl_values"),
            rq.Pad(8),
        )

    return UseExtension, PerClientFlags


def set_detectable_auto_repeat(display: Any) -> bool:
    """XkbSetDetectableAutoRepeat(True) for this connection; False where the server can't."""
    try:
        ext = display.query_extension("XKEYBOARD")
        if ext is None or not ext.present:
            return False
        use_extension, per_client_flags = _xkb_requests()
        used = use_extension(display=display.display, opcode=ext.major_opcode, wanted_major=1, wanted_minor=0)
        if not used.supported:
            return False
        reply = per_client_flags(
            display=display.display,
            opcode=ext.major_opcode,
            device_spec=XKB_USE_CORE_KBD,
            change=XKB_PCF_DETECTABLE_AUTO_REPEAT,
            value=XKB_PCF_DETECTABLE_AUTO_REPEAT,
            ctrls_to_change=0,
            auto_ctrls=0,
            auto_ctrl_values=0,
        )
        return bool(reply.value & XKB_PCF_DETECTABLE_AUTO_REPEAT)
    except Exception:  # an XKB that answers oddly: fall back to recognising the fake releases
        log.debug("XkbSetDetectableAutoRepeat failed", exc_info=True)
        return False
