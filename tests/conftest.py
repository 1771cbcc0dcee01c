import os
import random
import string
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(min(2, torch.get_num_threads()))  # OMP_NUM_THREADS=1 makes it one (.ci/determinism)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "trains: trains or calibrates, then compares results; it must hold by a margin "
        "under any thread count (.ci/determinism runs these with 1 and 2 threads)",
    )


@pytest.fixture(autouse=True)
def _deterministic_when_training(request):
    """Tests marked `trains` start from fixed seeds (torch, numpy, random), whatever ran before them, and run with
    torch's deterministic algorithms (on the CPU they change nothing today; they keep a future op honest).
    TTSQ_TEST_SEED_OFFSET=N (.ci/determinism) adds N to every torch.manual_seed of such a test: another start, as
    another CPU's rounding would give after a few steps, which a comparison by a hair does not survive."""
    if request.node.get_closest_marker("trains") is None:
        yield
        return
    offset = int(os.environ.get("TTSQ_TEST_SEED_OFFSET", "0"))
    manual_seed = torch.manual_seed
    if offset:
        torch.manual_seed = lambda seed: manual_seed(int(seed) + offset)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
        torch.manual_seed = manual_seed


TINY_CHARS = (
    string.ascii_lowercase + string.digits + string.punctuation + "你好世界今天天气很不错我们一起去公园吧。，！？"
)


def make_tiny_model(folder: Path, seed: int = 0):
    from toolkit.models import TTSModel, tiny
    from toolkit.models.tokenizer import build_char_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_char_tokenizer(TINY_CHARS, folder / "tokenizer.json")
    torch.manual_seed(seed)
    model = TTSModel(tiny(tok.vocab_size), tok).eval()
    with torch.no_grad():  # random-init ConvNeXt layer scales of 1 and norms of 1 hide bugs; perturb them
        for name, p in model.named_parameters():
            if name.endswith(("scale", "norm.weight")):
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
    return model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random-weight model in ttsq format."""
    from toolkit.checkpoint import save_ttsq

    work = tmp_path_factory.mktemp("tiny")
    model = make_tiny_model(work / "src")
    model.voices = {"alice": torch.randn(model.cfg.gpt.hidden)}
    return save_ttsq(model, work / "model")


@pytest.fixture(scope="session")
def tiny_synth(tiny_dir):
    from toolkit import Synthesizer

    return Synthesizer(tiny_dir, "cpu")
