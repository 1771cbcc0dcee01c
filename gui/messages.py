"""The library's messages in the GUI's words: a command-line flag in an error becomes the control that sets it."""

from __future__ import annotations

import re

#: flag -> the control's name as the GUI shows it
CONTROLS = {
    "--force": "“replace an existing output folder”",
    "--out": "“Output folder”",
    "--calib": "“Calibration set”",
    "--limit": "“Calibration texts”",
    "--keep-sensitive": "“Keep in float”",
    "--precision": "“Precision”",
    "--model": "the Model box",
    "--device": "“Device”",
    "--speaker": "“Speaker”",
    "--seed": "“Seed”",
    "--temperature": "“Temperature”",
    "--top-p": "“Top-p”",
    "--top-k": "“Top-k”",
    "--max-steps": "“Max steps”",
    "--control-tokens": "“read [laugh], [uv_break], ... as controls”",
}
PHRASES = [  # whole phrases first, where the verb changes with the control ("Pass" -> "Tick", "pass" -> "tick")
    (
        r"\b([Pp])ass --force\b",
        lambda m: ("T" if m.group(1) == "P" else "t") + "ick “replace an existing output folder”",
    ),
    (r"\b([Pp])ass --model with\b", lambda m: ("P" if m.group(1) == "P" else "p") + "ick in the Model box"),
    (r"\bttsq quantize --device (\S+) \.\.\.", r"Tools ▸ Quantize… with “Device” \1"),
    (r"\bttsq quantize\b", "Tools ▸ Quantize…"),
    (r"\bttsq export\b", "Tools ▸ Export to ONNX…"),
    (r"\b(run it )?with --device (\S+)", r"with “Device” \2"),
]


def for_gui(message: str) -> str:
    for pattern, words in PHRASES:
        message = re.sub(pattern, words, message)
    return re.sub(r"--[a-z][a-z-]*", lambda m: CONTROLS.get(m.group(0), m.group(0)), message)
