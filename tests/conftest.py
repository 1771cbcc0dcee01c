import os
import string
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
torch.set_num_threads(min(2, torch.get_num_threads()))

TINY_CHARS = string.ascii_lowercase + string.digits + string.punctuation + "你好世界今天天气很不错我们一起去公园吧。，！？"


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
