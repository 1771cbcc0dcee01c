# Two commands do everything on a fresh Debian machine:
#   make demo   set up, then quantize the shipped voice and compare precisions (prints a table)
#   make test   set up, then run the test suite
#   make test-determinism   the tests that train, under 1 and 2 threads and a shifted seed (.ci/determinism)
#   make lint   ruff's lint and format check (pyproject.toml [tool.ruff]); `ruff format .` fixes the format
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEB_PACKAGES := espeak-ng
# the voice corpus's natural text (training/voice/sources.py): English quotations and prose, Mandarin lines
DEB_PACKAGES += fortunes fortunes-min fortunes-zh
# the GUI (PySide6 offscreen/xcb, QtMultimedia, sounddevice) and its tests (Xvfb, a pulseaudio null sink)
DEB_PACKAGES += libegl1 libfontconfig1 libdbus-1-3 libxkbcommon0 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 \
  libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-shape0 libpulse0 libportaudio2 \
  pulseaudio xvfb
EXTRAS ?= eval,asr,edge,dev,gui,voicelab,serve,ray
OUT ?= out/demo

.PHONY: setup demo test test-determinism lint clean

# the Makefile as a prerequisite: a package added to DEB_PACKAGES is installed on an existing checkout too
$(VENV)/.deb-stamp: Makefile
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(VENV)/.pip-stamp: pyproject.toml $(VENV)/.deb-stamp
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q "setuptools<81" wheel cython numpy
	$(PIP) install -q -e ".[$(EXTRAS)]"
	@touch $@

setup: $(VENV)/.pip-stamp

demo: setup
	$(PY) -m evaluation.demo --out $(OUT)

test: setup
	bash .ci/test

test-determinism: setup
	bash .ci/determinism

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) out
