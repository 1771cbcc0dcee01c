"""Playback: sounddevice (PortAudio) first, QtMultimedia as the fallback, and a clear "no output device" otherwise."""

from __future__ import annotations

import time

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal


class NoOutputDevice(RuntimeError):
    pass


def _sounddevice():
    """The sounddevice module when PortAudio sees a default output device, else None."""
    try:
        import sounddevice as sd

        sd.query_devices(kind="output")  # raises when there is no default output
        return sd
    except Exception:  # noqa: BLE001 -- OSError (no libportaudio), PortAudioError, ValueError
        return None


def _qt_output():
    try:
        from PySide6.QtMultimedia import QMediaDevices

        dev = QMediaDevices.defaultAudioOutput()
        return None if dev.isNull() else dev
    except Exception:  # noqa: BLE001 -- QtMultimedia or libpulse missing
        return None


class Player(QObject):
    """play(wav, sr, offset_s) / stop(); `finished` when the audio ends or is stopped."""

    finished = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._backend: str | None = None
        self._probed = False
        self._sd = None
        self._qt_dev = None
        self._sink = None
        self._buffer = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._ended)
        self._started = 0.0
        self._offset = 0.0
        self.playing = False

    def backend(self) -> str | None:
        """'sounddevice', 'qt' or None (no output device)."""
        if not self._probed:
            self._probed = True
            self._sd = _sounddevice()
            if self._sd is not None:
                self._backend = "sounddevice"
            else:
                self._qt_dev = _qt_output()
                self._backend = "qt" if self._qt_dev is not None else None
        return self._backend

    def describe(self) -> str:
        b = self.backend()
        if b == "sounddevice":
            return f"audio: {self._sd.query_devices(kind='output')['name']} (sounddevice)"
        if b == "qt":
            return f"audio: {self._qt_dev.description()} (QtMultimedia)"
        return "audio: no output device (use Save as WAV)"

    def position(self) -> float:
        return self._offset + (time.perf_counter() - self._started if self.playing else 0.0)

    def play(self, wav: np.ndarray, sr: int, offset_s: float = 0.0) -> None:
        b = self.backend()
        if b is None:
            raise NoOutputDevice(
                "No audio output device was found (no sound card or sound server). "
                "Save the result as a WAV file and play it elsewhere."
            )
        self.stop(emit=False)
        start = min(int(offset_s * sr), len(wav))
        clip = np.clip(np.asarray(wav[start:], dtype=np.float32), -1.0, 1.0)
        if b == "sounddevice":
            self._sd.play(clip, sr)
        else:
            self._play_qt(clip, sr)
        self._offset, self._started, self.playing = start / sr, time.perf_counter(), True
        self._timer.start(int(1000 * len(clip) / sr) + 50)

    def _play_qt(self, clip: np.ndarray, sr: int) -> None:
        from PySide6.QtCore import QBuffer, QByteArray, QIODevice
        from PySide6.QtMultimedia import QAudioFormat, QAudioSink

        fmt = QAudioFormat()
        fmt.setSampleRate(sr)
        fmt.setChannelCount(1)
        fmt.setSampleFormat(QAudioFormat.Int16)
        self._buffer = QBuffer(self)
        self._buffer.setData(QByteArray((clip * 32767).astype("<i2").tobytes()))
        self._buffer.open(QIODevice.ReadOnly)
        self._sink = QAudioSink(self._qt_dev, fmt, self)
        self._sink.start(self._buffer)

    def stop(self, emit: bool = True) -> None:
        was = self.playing
        self._timer.stop()
        if self._backend == "sounddevice" and self._sd is not None and was:
            self._sd.stop()
        if self._sink is not None:
            self._sink.stop()
            self._sink = None
        self.playing = False
        if was and emit:
            self.finished.emit()

    def _ended(self) -> None:
        self.stop()
