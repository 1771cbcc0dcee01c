"""ttsq's lab: how the shipped voice was made. Not part of the installed package (pyproject.toml installs toolkit,
evaluation and gui only); run it from a checkout, e.g. `python -m training.voice.train --smoke --out /tmp/smoke`."""
