"""The voice lab's training options: the input-code corruption (train --code-noise) changes audio inputs at about
the asked rate, text positions never, and never into the EOS code; the typed stage configs read the flags."""

import torch

from training.voice.train import corrupt_codes


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


def test_each_stage_config_reads_its_own_flags_and_defaults_as_the_command_line_does():
    """train's typed stage configs: --vocos-lr is VocosStage.lr, --gpt-lr GPTStage.lr, shared flags (--seed) reach
    every stage, and a config built in code has the command line's defaults."""
    from pathlib import Path

    from training.voice.train import DVAEStage, ExportConfig, GPTStage, VocosStage, parser, stage_config

    args = parser().parse_args(["--out", "r", "--seed", "3", "--vocos-lr", "1e-4", "--gpt-lr", "2e-4", "--guided", "0"])
    vocos, gpt = stage_config(VocosStage, args, "vocos_"), stage_config(GPTStage, args, "gpt_")
    assert (vocos.lr, vocos.seed, vocos.out) == (1e-4, 3, Path("r"))
    assert (gpt.lr, gpt.seed, gpt.guided) == (2e-4, 3, 0.0)
    defaults = parser().parse_args(["--out", "r"])
    assert stage_config(VocosStage, defaults, "vocos_") == VocosStage(out=Path("r"))
    assert stage_config(DVAEStage, defaults, "dvae_") == DVAEStage(out=Path("r"))
    assert stage_config(GPTStage, defaults, "gpt_") == GPTStage(out=Path("r"))
    export = parser().parse_args(["--export", "v", "--resume", "r", "--data", "p"])
    assert stage_config(ExportConfig, export) == ExportConfig(export=Path("v"), resume=Path("r"), data=Path("p"))


def test_reset_speakers_redraws_only_the_named_rows_at_the_tables_norm():
    """train --reset-speakers f2,f4: those rows are new random vectors at the table's mean row norm, the others are
    kept, the same seed draws the same vectors, and a voice the pack lacks stops the run with its name."""
    import numpy as np
    import pytest

    from training.voice.train import GPTStage, parser, reset_speaker_rows, stage_config

    speakers = ["m1", "f2", "m3", "f4"]
    table = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    out = table.clone()
    reset_speaker_rows(out, speakers, "f2, f4", np.random.default_rng(0))
    assert torch.equal(out[[0, 2]], table[[0, 2]])
    cos = torch.nn.functional.cosine_similarity(out[[1, 3]], table[[1, 3]], dim=1)
    assert cos.abs().max() < 0.5  # new directions, not the old vectors
    assert torch.allclose(out[[1, 3]].norm(dim=1), table.norm(dim=1).mean().expand(2), rtol=1e-5)
    again = table.clone()
    reset_speaker_rows(again, speakers, "f2,f4", np.random.default_rng(0))
    assert torch.equal(again, out)
    with pytest.raises(SystemExit, match="'f9' is not one of the pack's speakers"):
        reset_speaker_rows(table.clone(), speakers, "f9", np.random.default_rng(0))
    args = parser().parse_args(["--out", "r", "--reset-speakers", "f2,f4"])
    assert stage_config(GPTStage, args, "gpt_").reset_speakers == "f2,f4"


def test_onset_weight_counts_each_utterances_first_frames_more():
    """train --onset-weight 5 --onset-frames 3: the code loss weighs the targets of each row's first 3 audio frames
    (which start after its own prompt) 5 times, and weight 1 is the plain loss."""
    from training.voice.train import GPTStage, code_loss, onset_weights, parser, stage_config

    T = torch.tensor([4, 6])  # prompt lengths: row 0's first audio target sits at position 3, row 1's at 5
    w = onset_weights(T, 10, frames=3, weight=5.0)
    assert w[0].tolist() == [1, 1, 1, 5, 5, 5, 1, 1, 1, 1]
    assert w[1].tolist() == [1, 1, 1, 1, 1, 5, 5, 5, 1, 1]
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(6, 4, 30, generator=g), torch.randint(0, 29, (6, 4), generator=g)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 30), target.reshape(-1), reduction="none")
    per_row = ce.view(6, 4).sum(1)
    rows = torch.tensor([5.0, 1, 1, 1, 1, 1])
    assert torch.allclose(code_loss(logits, target, 29, row_weight=rows), (per_row * rows).sum() / (4 * rows.sum()))
    assert torch.allclose(code_loss(logits, target, 29, row_weight=torch.ones(6)), code_loss(logits, target, 29))
    args = parser().parse_args(["--out", "r", "--onset-weight", "5", "--onset-frames", "12"])
    st = stage_config(GPTStage, args, "gpt_")
    assert (st.onset_weight, st.onset_frames) == (5.0, 12)
