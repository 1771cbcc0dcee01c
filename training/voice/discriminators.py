"""GAN discriminators and their losses, for training the Vocos vocoder and the Decoder. Training only.

Multi-period (HiFi-GAN): the waveform folded by each period, so each sees one phase of a periodic signal.
Multi-resolution (Vocos): compressed STFT magnitudes at three resolutions, against buzz and smeared harmonics.
Hinge adversarial loss and L1 feature matching, weighted as Vocos (mel reconstruction 45, adversarial and
feature matching 1 for the period and 0.1 for the resolution discriminators).
Mel patches: the Decoder's log-mel windows against real ones, against the over-smoothing of a regression loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

PERIODS = (2, 3, 5, 7, 11)
RESOLUTIONS = ((2048, 512), (1024, 256), (512, 128))  # (n_fft, hop)
MEL_WEIGHT, RESOLUTION_WEIGHT = 45.0, 0.1


def conv_stack(convs: nn.ModuleList, post: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """-> (logits (B, n), every layer's activations, for feature matching)"""
    feats = []
    for conv in convs:
        x = F.leaky_relu(conv(x), 0.1)
        feats.append(x)
    x = post(x)
    return x.flatten(1), feats + [x]


class PeriodDiscriminator(nn.Module):
    """wav (B, T) -> logits (B, n), features; T is reflect-padded to a multiple of the period."""

    def __init__(self, period: int, widths=(32, 128, 512, 1024, 1024)):
        super().__init__()
        self.period = period
        chans = (1,) + tuple(widths)
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(c_in, c_out, (5, 1), (3 if i < len(widths) - 1 else 1, 1), (2, 0)))
            for i, (c_in, c_out) in enumerate(zip(chans[:-1], chans[1:]))
        )
        self.post = weight_norm(nn.Conv2d(widths[-1], 1, (3, 1), 1, (1, 0)))

    def forward(self, wav: Tensor) -> tuple[Tensor, list[Tensor]]:
        B, T = wav.shape
        pad = -T % self.period
        x = F.pad(wav[:, None], (0, pad), mode="reflect").view(B, 1, (T + pad) // self.period, self.period)
        return conv_stack(self.convs, self.post, x)


class PatchDiscriminator(nn.Module):
    """A spectrogram-like image (B, 1, bins, frames) -> logits over its patches (B, n), features."""

    def __init__(self, shapes, width: int = 32):
        super().__init__()
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(1 if i == 0 else width, width, k, s, p)) for i, (k, s, p) in enumerate(shapes)
        )
        self.post = weight_norm(nn.Conv2d(width, 1, 3, 1, 1))

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        return conv_stack(self.convs, self.post, x)


class ResolutionDiscriminator(PatchDiscriminator):
    """wav (B, T) -> logits over (frequency, time) of its STFT magnitude (compressed by a 0.3 power), features."""

    def __init__(self, n_fft: int, hop: int, width: int = 32):
        super().__init__(
            [
                ((7, 5), (2, 2), (3, 2)),
                ((5, 3), (2, 1), (2, 1)),
                ((5, 3), (2, 1), (2, 1)),
                ((3, 3), (2, 1), (1, 1)),
                ((3, 3), (2, 2), (1, 1)),
            ],
            width,
        )  # (kernel, stride, padding)
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)

    def forward(self, wav: Tensor) -> tuple[Tensor, list[Tensor]]:
        spec = torch.stft(wav.float(), self.n_fft, self.hop, window=self.window, return_complex=True)
        return super().forward((spec.abs() + 1e-7).pow(0.3)[:, None])  # (B, 1, n_fft/2+1, frames)


class MelDiscriminator(PatchDiscriminator):
    """log-mel (B, n_mels, frames) -> logits over (mel band, frame) patches, features. Fine strides: the detail a
    regression loss smooths away (harmonics in the low bands, onsets) spans a few bins and frames."""

    def __init__(self, width: int = 32):
        super().__init__(
            [
                ((3, 3), (1, 1), (1, 1)),
                ((5, 3), (2, 1), (2, 1)),
                ((5, 3), (2, 2), (2, 1)),
                ((3, 3), (2, 1), (1, 1)),
                ((3, 3), (2, 2), (1, 1)),
            ],
            width,
        )

    def forward(self, mel: Tensor) -> tuple[Tensor, list[Tensor]]:
        return super().forward(((mel.float() + 5.0) / 3.0)[:, None])  # log-mels span about -11.5 .. 4.5


class DiscriminatorSet(nn.Module):
    """Weighted discriminators over the same input, with the hinge and feature-matching losses of them all."""

    def __init__(self, nets: list[nn.Module], weights: list[float]):
        super().__init__()
        self.nets, self.weights = nn.ModuleList(nets), weights

    def forward(self, x: Tensor) -> list[tuple[Tensor, list[Tensor]]]:
        return [net(x) for net in self.nets]

    def loss(self, real: Tensor, fake: Tensor) -> Tensor:
        """Hinge loss of the discriminators: real above +1, fake below -1 (pass fake detached)."""
        total = 0.0
        for w, (r, _), (f, _) in zip(self.weights, self(real), self(fake)):
            total = total + w * (F.relu(1 - r.float()).mean() + F.relu(1 + f.float()).mean())
        return total

    def generator_loss(self, real: Tensor, fake: Tensor) -> tuple[Tensor, Tensor]:
        """-> (adversarial hinge loss, feature-matching L1) for the generator's output fake."""
        with torch.no_grad():
            real_out = self(real)
        adv, fm = 0.0, 0.0
        for w, (_, rf), (f, ff) in zip(self.weights, real_out, self(fake)):
            adv = adv + w * F.relu(1 - f.float()).mean()
            fm = fm + w * sum(F.l1_loss(b.float(), a.float()) for a, b in zip(rf, ff))
        return adv, fm


class Discriminators(DiscriminatorSet):
    """The vocoder's: waveforms (B, T)."""

    def __init__(self, periods=PERIODS, resolutions=RESOLUTIONS):
        super().__init__(
            [PeriodDiscriminator(p) for p in periods] + [ResolutionDiscriminator(n, h) for n, h in resolutions],
            [1.0] * len(periods) + [RESOLUTION_WEIGHT] * len(resolutions),
        )


class MelDiscriminators(DiscriminatorSet):
    """The Decoder's: log-mel windows (B, n_mels, frames)."""

    def __init__(self):
        super().__init__([MelDiscriminator()], [1.0])
