"""ttsq: quantize and evaluate ChatTTS-style TTS models."""
