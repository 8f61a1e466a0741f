"""The Output area: which tool would deliver the text here (the app's own chooser decides), and
whether each typing and clipboard tool of this session kind is installed (ydotool's daemon too)."""

from __future__ import annotations

from typing import Any

from dictation.doctor.check import Check, Context

YDOTOOLD_FIX = (
    "start the ydotool daemon: `systemctl --user enable --now ydotool` where the package ships that "
    "service, else add `ydotoold &` to your session's startup (it needs write access to /dev/uinput)"
)

_OUTPUT_TOOLS = {
    "x11": (
        ("xdotool", ("xdotool",), "sends the paste keys and types"),
        ("xclip", ("xclip",), "clipboard, keeps images too"),
        ("xsel", ("xsel",), "clipboard, text only; used without xclip"),
        ("xmodmap", ("xmodmap",), "lets xdotool type non-ASCII text reliably"),
    ),
    "wayland": (
        ("wtype", ("wtype",), "sends keys on wlroots compositors (Sway, Hyprland, river, ...)"),
        ("ydotool", ("ydotool",), "sends keys on any compositor, through its daemon ydotoold"),
        ("wl-clipboard", ("wl-copy", "wl-paste"), "the Wayland clipboard"),
    ),
}


def checks(ctx: Context) -> list[Check]:
    from dictation.output.environment import NO_VIRTUAL_KEYBOARD_DESKTOPS, detect_session
    from dictation.output.keys import YdotoolKeys
    from dictation.output.process import SystemHost
    from dictation.output.select import choose_backend, plan_backends

    area = "Output"
    session = detect_session(ctx.env, ctx.platform)
    host = SystemHost(ctx.env)
    options = ctx.settings.output
    checks: list[Check] = []
    delivering = False
    try:
        names, _forced = plan_backends(session.kind, options.backend, options.method)
    except ValueError as exc:
        checks.append(
            Check(
                area,
                "Text delivery",
                "problem",
                str(exc),
                "set Output tool to Automatic (or wtype, ydotool, xdotool, pynput) on the Output page",
            )
        )
    else:
        chain = choose_backend(options, ctx.env, platform=ctx.platform, host=host)
        statuses = chain.statuses()
        members = statuses[: len(chain.backends)]
        active = next((s for s in members if s.ok), None)
        order = ", ".join(names) + (", then the clipboard" if chain.fallback is not None else "")
        if names == ("clipboard",):
            delivering = True
            checks.append(
                Check(area, "Text delivery", "info", "clipboard only (chosen in settings): you paste the text yourself")
            )
        elif active is not None:
            delivering = True
            note = "" if active.unicode != "no" else "; it cannot type non-ASCII text"
            checks.append(Check(area, "Text delivery", "ok", f"{active.name}: {active.reason}{note} (order: {order})"))
        else:
            reasons = "; ".join(f"{s.name}: {s.reason}" for s in members)
            clipboard = statuses[-1] if chain.fallback is not None else None
            if clipboard is not None and clipboard.ok:
                detail = f"no tool can send keys here, so the text is only put on the clipboard ({reasons})"
            else:
                detail = f"the text can't be delivered at all ({reasons})"
            checks.append(Check(area, "Text delivery", "problem", detail, _output_fix(ctx, session)))

    for row, tools, purpose in _OUTPUT_TOOLS.get(session.kind, ()):
        paths = [ctx.which(t) for t in tools]
        unusable = row == "wtype" and session.desktop in NO_VIRTUAL_KEYBOARD_DESKTOPS
        if all(paths):
            if unusable:
                detail = (
                    f"{paths[0]}, but {session.desktop} has no virtual-keyboard protocol: wtype can't send keys there"
                )
                checks.append(Check(area, row, "info", detail))
            else:
                checks.append(Check(area, row, "ok", f"{', '.join(p for p in paths if p)}: {purpose}"))
            if row == "ydotool":
                sockets = YdotoolKeys(host, session).socket_candidates()
                running = next((s for s in sockets if host.exists(s)), None)
                if running:
                    checks.append(Check(area, "ydotoold", "ok", f"running (socket {running})"))
                else:
                    status = "info" if delivering else "warning"
                    detail = f"not running (no socket at {' or '.join(sockets)})"
                    checks.append(Check(area, "ydotoold", status, detail, YDOTOOLD_FIX))
            continue
        missing = [t for t, p in zip(tools, paths, strict=True) if not p]
        if unusable:
            checks.append(Check(area, row, "info", f"not installed (it would not work on {session.desktop} anyway)"))
        elif row == "xsel" and ctx.which("xclip"):
            checks.append(Check(area, row, "info", f"not installed (not needed: xclip is there); {purpose}"))
        else:
            status = "info" if delivering else "warning"
            checks.append(Check(area, row, status, f"not installed ({purpose})", ctx.install(*missing)))
    return checks


def _output_fix(ctx: Context, session: Any) -> str | None:
    from dictation.output.environment import NO_VIRTUAL_KEYBOARD_DESKTOPS

    if session.kind == "x11":
        wanted = ["xdotool"] + ([] if ctx.which("xclip") or ctx.which("xsel") else ["xclip"])
        missing = [t for t in wanted if not ctx.which(t)]
        return ctx.install(*missing) if missing else None
    if session.kind == "wayland":
        ydotool = session.desktop in NO_VIRTUAL_KEYBOARD_DESKTOPS
        wanted = ["ydotool" if ydotool else "wtype", "wl-copy"]
        missing = [t for t in wanted if not ctx.which(t)]
        steps = [ctx.install(*missing)] if missing else []
        if ydotool:
            steps.append(YDOTOOLD_FIX)
        return ", then ".join(steps) if steps else None
    if session.kind == "macos":
        return (
            "allow the app that runs dictation under System Settings → Privacy & Security → Accessibility "
            "(and `pip install pynput` if it is missing)"
        )
    if session.kind == "windows":
        return "`pip install pynput`"
    return "start dictation from inside your desktop session"
