"""The voice lab: the espeak-ng corpus (corpus, sources, espeak), the three training stages (train, with
discriminators and the shared sizes in config) and the tools that measure a voice (measure, gap, alignment)."""
