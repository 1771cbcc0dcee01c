"""Evaluation of ttsq precisions against the FP32 reference.

Objective audio metrics live in :mod:`evaluation.metrics`. Nothing in this
package imports torch at import time.
"""
