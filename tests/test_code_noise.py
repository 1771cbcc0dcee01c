"""The voice lab's input-code corruption (train --code-noise): audio inputs change at about the asked rate, text
positions never, and never into the EOS code."""

import torch

from toolkit.voice.train import corrupt_codes


def test_corruption_touches_audio_inputs_only_at_the_asked_rate():
    torch.manual_seed(0)
    cod = torch.randint(0, 625, (8, 200, 4))
    is_audio = torch.zeros(8, 200, dtype=torch.bool)
    is_audio[:, 50:] = True
    out = corrupt_codes(cod, is_audio, 0.3, 626)
    changed = out != cod
    assert not changed[:, :50].any()
    assert 0.25 < changed[:, 50:].float().mean().item() < 0.31  # 0.3 less the ~1/625 drawn unchanged
    assert int(out.max()) < 625
    assert corrupt_codes(cod, is_audio, 0.0, 626) is cod
