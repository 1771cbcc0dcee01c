"""ttsq desktop GUI (PySide6): pick precisions, synthesize, listen, compare latency against quality.

A thin layer over the library: toolkit.Synthesizer synthesizes, evaluation.metrics scores, evaluation.report
writes reports, toolkit.quantize_job / toolkit.export make artifacts. Start it with `ttsq gui` or `python -m gui`.
"""
