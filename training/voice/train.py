"""Train ttsq's shipped voice from an espeak-ng corpus pack (see training.voice.corpus). Three stages:

  vocos  mel -> wav (mel L1 + multi-resolution STFT losses; with --vocos-gan also discriminators) on the PCM subset
  dvae   mel -> GFSQ codes (4 codebooks of 625 = 5^4, G=2, R=2, straight-through) -> DVAEDecoder -> mel
  gpt    phoneme tokens + speaker -> codes (ChatTTS prompt layout, teacher forced, EOS = 625 in every codebook)
         jointly with the Decoder (GPT hidden states -> mel, L1; with --decoder-gan also mel-patch
         discriminators), a guided-attention loss on two heads, and a short-to-long curriculum

Seeded; bounded by --minutes (wall clock) or --steps; resumes from --resume (weights of any dtype).
With --parallel the vocoder trains in a second process next to dvae -> gpt (one GPU holds both).

  python -m training.voice.train --data corpus/pack --out runs/voice --minutes 8.5 --parallel --device cuda
  python -m training.voice.train --export toolkit/assets/voice --resume runs/voice --data corpus/pack
  python -m training.voice.train --smoke --out /tmp/smoke       # seconds on CPU: tiny corpus, tiny model
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from toolkit.checkpoint import convstack_config
from toolkit.models.config import GPTConfig, ModelConfig, VocosConfig
from toolkit.models.convnext import ConvNeXtBlock
from toolkit.models.decoder import ConvStack, DVAEDecoder
from toolkit.models.dvae_encoder import VoiceEncoder as DVAEEncoder  # noqa: F401 (names kept)
from toolkit.models.dvae_encoder import codes_from_digits, quantise
from toolkit.models.gpt import GPT, Block
from toolkit.models.speaker import apply_speaker
from toolkit.models.vocos import LogMel, Vocos

from .config import ENCODER_FILE, SHIPPED_ENCODER, voice_config
from .discriminators import MEL_WEIGHT, Discriminators, DiscriminatorSet, MelDiscriminators
from .withdraw import offered_voices

SHARD_BYTES = 15 * 2**20
MEL_LO, MEL_HI = -11.6, 4.4


# --- what each stage reads ------------------------------------------------------------------------
@dataclasses.dataclass
class VocosStage:
    """Stage 1: the vocoder (mel -> wav)."""

    out: Path  # the run folder its checkpoints go to
    resume: Path | None = None  # a run folder to resume from
    seed: int = 0
    smoke: bool = False  # tiny shapes (the CPU smoke run)
    log_every: int = 50
    batch: int = 32
    lr: float = 5e-4
    minutes: float | None = None  # wall-clock budget; with steps, whichever ends first (None: no limit)
    steps: int | None = None
    gan: bool = False  # adversarial training against discriminators.Discriminators
    grow: int = 0  # new layers appended to a resumed vocoder


@dataclasses.dataclass
class DVAEStage:
    """Stage 2: the DVAE (mel -> codes -> mel)."""

    out: Path
    resume: Path | None = None
    seed: int = 0
    smoke: bool = False
    log_every: int = 50
    batch: int = 64
    lr: float = 1e-3
    minutes: float | None = None
    steps: int | None = None


@dataclasses.dataclass
class GPTStage:
    """Stage 3: the GPT (text -> codes) and the Decoder (GPT states -> mel), trained together."""

    out: Path
    resume: Path | None = None
    seed: int = 0
    log_every: int = 50
    batch: int = 64
    lr: float = 6e-4
    minutes: float | None = None
    steps: int | None = None
    tokens: int = 24000  # a batch's rows are capped at this many positions in all
    save_every: float = 2.0  # minutes between checkpoints (0: only at the end)
    restart_schedule: bool = False  # a resumed run starts its curriculum and guided-attention schedule again
    freeze_gpt: bool = False  # train the Decoder only
    code_noise: float = 0.0  # share of the GPT's input audio codes replaced by random ones (targets kept)
    reset_speakers: str = ""  # comma-separated voices whose speaker vectors a resumed run draws afresh
    onset_frames: int = 24  # the first audio frames of each utterance, weighted onset_weight in the code loss
    onset_weight: float = 1.0
    eos_weight: float = 1.0
    guided: float = 1.0  # guided-attention loss weight
    mel_weight: float = 1.0
    decoder_stft: float = 0.0  # weight of the vocoded STFT loss on the Decoder's mels
    decoder_gan: float = 0.0  # weight of the mel-patch discriminators' loss
    decoder_gan_windows: int = 1


@dataclasses.dataclass
class ExportConfig:
    """A run's checkpoints as a ttsq voice folder."""

    export: Path  # the voice folder written
    resume: Path  # the run folder read
    data: Path  # the corpus pack (its tokenizer and speakers)
    smoke: bool = False
    decoder_from: Path | None = None  # a Decoder trained apart, in place of the run's own
    default_voice: str | None = None
    export_fp16: bool = False
    withdraw: str = ""  # comma-separated voices left out of the folder (training.voice.withdraw)


def stage_config(cls, args: argparse.Namespace, prefix: str = ""):
    """cls's fields from the command line: PREFIX_name where the flag has the stage's prefix (--vocos-lr: lr), else
    name (--seed)."""
    return cls(
        **{f.name: getattr(args, prefix + f.name, getattr(args, f.name, f.default)) for f in dataclasses.fields(cls)}
    )


# --- checkpoints: sharded, any dtype -------------------------------------------------------------
def save_state(folder: Path, name: str, state: dict[str, Tensor], meta: dict, dtype=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{name}.*.pt"):
        old.unlink()
    shards, cur, size = [], {}, 0
    for k, v in state.items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        if cur and size + v.numel() * v.element_size() > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v.contiguous()
        size += v.numel() * v.element_size()
    shards.append(cur)
    for i, s in enumerate(shards):
        torch.save(s, folder / f"{name}.{i}.pt")
    (folder / f"{name}.json").write_text(json.dumps({**meta, "shards": len(shards)}, indent=1))


def load_state(folder: Path | None, name: str) -> tuple[dict[str, Tensor], dict] | None:
    if folder is None or not (Path(folder) / f"{name}.json").is_file():
        return None
    folder = Path(folder)
    meta = json.loads((folder / f"{name}.json").read_text())
    state = {}
    for i in range(meta["shards"]):
        state.update(torch.load(folder / f"{name}.{i}.pt", map_location="cpu", weights_only=True))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, meta


def sub_state(state: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def run_config(
    cfg: ModelConfig,
    gpt_state: dict | None,
    hidden: int | None = None,
    layers: int | None = None,
    vocos_state: dict | None = None,
) -> ModelConfig:
    """cfg with the GPT depth and the Decoder that a run's gpt checkpoint holds (its weights' shapes say their sizes),
    then --decoder-hidden and --decoder-layers over that: a Decoder of a new size is trained from scratch; and the
    vocoder depth of its vocos checkpoint."""
    dec, gpt = cfg.decoder, cfg.gpt
    if vocos_state is not None:
        cfg = dataclasses.replace(cfg, vocos=dataclasses.replace(cfg.vocos, layers=vocos_layer_count(vocos_state)))
    if gpt_state is not None and "decoder.conv_in.2.weight" in gpt_state:
        dec = convstack_config(sub_state(gpt_state, "decoder."), "", dec.idim)
    if gpt_state is not None and "gpt.layers.0.attention.wo.weight" in gpt_state:
        gpt = dataclasses.replace(gpt, layers=gpt_layer_count(gpt_state))
    return dataclasses.replace(
        cfg, gpt=gpt, decoder=dataclasses.replace(dec, hidden=hidden or dec.hidden, layers=layers or dec.layers)
    )


def gpt_layer_count(gpt_state: dict) -> int:
    return len({k.split(".")[2] for k in gpt_state if k.startswith("gpt.layers.")})


def grow_gpt_layers(gpt_state: dict, cfg: GPTConfig, new: int, seed: int) -> dict:
    """A run's gpt state with `new` more blocks, one after each of the last `new` layers, so the guided-attention
    layer keeps its index. Each new block starts as the identity (its attention output and FFN down projections are
    zero; the rest is a fresh init, which gets gradients through them): the grown GPT computes what the old one did,
    so its Decoder still fits, and training goes on from there with more depth."""
    old = gpt_layer_count(gpt_state)
    if not 0 < new <= old - GUIDED_LAYER:
        raise SystemExit(
            f"--gpt-grow {new}: a GPT of {old} layers takes 1 to {old - GUIDED_LAYER} new blocks "
            f"(one after each of its last layers, from the guided-attention layer {GUIDED_LAYER} on)"
        )
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        torch.manual_seed(seed)
        fresh = Block(cfg).state_dict()
    fresh = {
        k: torch.zeros_like(v) if k.endswith(("attention.wo.weight", "feed_forward.w2.weight")) else v
        for k, v in fresh.items()
    }
    out = {k: v for k, v in gpt_state.items() if not k.startswith("gpt.layers.")}
    pos = 0
    for i in range(old):
        out.update({f"gpt.layers.{pos}.{k}": v for k, v in sub_state(gpt_state, f"gpt.layers.{i}.").items()})
        pos += 1
        if i >= old - new:
            out.update({f"gpt.layers.{pos}.{k}": v.clone() for k, v in fresh.items()})
            pos += 1
    return out


def vocos_layer_count(vocos_state: dict) -> int:
    return len({k.split(".")[1] for k in vocos_state if k.startswith("blocks.")})


def grow_vocos_layers(vocos_state: dict, cfg: VocosConfig, new: int, seed: int) -> dict:
    """A vocoder's state with `new` more ConvNeXt blocks after its last. Each starts as the identity (layer scale zero,
    whose gradient opens it; the rest a fresh init): the grown vocoder renders what the old one did, with more depth
    and 3 frames more reach per block (espeak's echo, 130-140 ms or 12-13 frames back, is what it renders worst)."""
    old = vocos_layer_count(vocos_state)
    out = dict(vocos_state)
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        torch.manual_seed(seed)
        for i in range(old, old + new):
            fresh = ConvNeXtBlock(cfg.dim, cfg.intermediate).state_dict()
            out.update({f"blocks.{i}.{k}": torch.zeros_like(v) if k == "scale" else v for k, v in fresh.items()})
    return out


# --- data ----------------------------------------------------------------------------------------
class Data:
    def __init__(self, pack: dict, device):
        self.mel_q = torch.from_numpy(pack["mel"])  # (frames, 100) uint8
        self.mel_off = pack["mel_off"]
        self.ids = torch.from_numpy(pack["ids"].astype(np.int64))
        self.ids_off = pack["ids_off"]
        self.spk = torch.from_numpy(pack["spk"].astype(np.int64))
        self.wav = torch.from_numpy(pack["wav"].astype(np.float32) / 32768.0)
        self.wav_off = pack["wav_off"]
        self.wav_utt = pack["wav_utt"]  # the utterance of each PCM part
        self.info = pack["info"]
        self.n = len(self.spk)
        self.frames = np.diff(self.mel_off)
        self.steps = self.frames // 2
        self.device = device
        self.codes = None  # a codes pack (corpus --codes-from): (steps, Q) per utterance, mels only with --keep-mels
        self.has_mels = len(self.mel_q) > 0
        if "codes" in pack:
            c, off = torch.from_numpy(pack["codes"].astype(np.int64)), pack["codes_off"]
            self.codes = [c[off[i] : off[i + 1]] for i in range(self.n)]

    def mel(self, i: int) -> Tensor:
        if not self.has_mels:
            raise ValueError(
                "this pack holds DVAE codes, not mels: only the gpt stage trains on it "
                "(with --resume from a run or --from-voice checkpoints that have the DVAE)"
            )
        q = self.mel_q[self.mel_off[i] : self.mel_off[i + 1]].float()
        return (q / 255.0 * (MEL_HI - MEL_LO) + MEL_LO).T  # (100, F)

    def prompt(self, i: int) -> Tensor:
        return self.ids[self.ids_off[i] : self.ids_off[i + 1]]


def lr_at(step: int, frac: float, peak: float, warmup: int) -> float:
    w = min(1.0, (step + 1) / warmup)
    return peak * w * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def set_lr(lr: float, *optimizers) -> None:
    for opt in filter(None, optimizers):
        for pg in opt.param_groups:
            pg["lr"] = lr


class Budget:
    def __init__(self, minutes: float | None, steps: int | None):
        self.t0, self.seconds, self.steps = time.time(), (minutes or 0) * 60, steps

    def frac(self, step: int) -> float:
        if self.steps:
            return step / self.steps
        return (time.time() - self.t0) / max(self.seconds, 1e-9)

    def done(self, step: int) -> bool:
        return self.frac(step) >= 1.0


def autocast(device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


# --- stage 1: vocoder ----------------------------------------------------------------------------
def stft_mag(x: Tensor, n_fft: int, hop: int) -> Tensor:
    win = torch.hann_window(n_fft, device=x.device)
    return torch.stft(x, n_fft, hop, window=win, return_complex=True).abs().clamp(min=1e-5)


def stft_loss(y: Tensor, x: Tensor) -> Tensor:
    """Multi-resolution STFT loss of y against x (B, T): spectral convergence + log-magnitude L1, mean of three."""
    loss = 0.0
    for n_fft, hop in ((512, 128), (1024, 256), (2048, 512)):
        a, b = stft_mag(y, n_fft, hop), stft_mag(x, n_fft, hop)
        loss = loss + (b - a).norm() / b.norm() + F.l1_loss(a.log(), b.log())
    return loss / 3


def reconstruction_loss(logmel: LogMel, y: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """-> (log-mel L1, multi-resolution STFT loss) of y against x (B, T)."""
    return F.l1_loss(logmel(y), logmel(x)), stft_loss(y, x)


def mel_windows(
    mel_pred: Tensor, mel: Tensor, fmask: Tensor, frames: int, g, per_row: int = 1
) -> tuple[Tensor, Tensor] | None:
    """`per_row` random windows of `frames` valid frames from each utterance that has one: (predicted, real), each
    (rows * per_row, n_mels, frames); None if no utterance is long enough."""
    valid = fmask.sum(1).tolist()  # one device sync for the batch
    picks = [
        (r, int(g.integers(0, valid[r] - frames + 1)))
        for r, n in enumerate(valid)
        if n >= frames
        for _ in range(per_row)
    ]
    if not picks:
        return None
    return tuple(torch.stack([m[r, :, o : o + frames] for r, o in picks]).float() for m in (mel_pred, mel))


def vocoded_stft_loss(vocos: Vocos, mel_pred: Tensor, mel: Tensor, fmask: Tensor, frames: int, g) -> Tensor:
    """The Decoder's detail loss: a window of `frames` valid mel frames per utterance (those that have one), the
    predicted and the real mel each through the frozen vocoder, compared with stft_loss. Mel L1 alone rewards the
    average, which the vocoder renders dull; this scores what the vocoder makes of it. Zero if no row is long enough."""
    windows = mel_windows(mel_pred, mel, fmask, frames, g)
    if windows is None:
        return mel_pred.new_zeros(())
    pred, real = windows
    with torch.no_grad():
        ref = vocos(real)
    return stft_loss(vocos(pred), ref)


def resumed_discriminators(disc: DiscriminatorSet, resume: Path | None, name: str, lr: float, betas, device):
    """-> (disc on device, with the run's `name` checkpoint loaded where --resume has one; its AdamW)."""
    disc = disc.to(device)
    prev = load_state(resume, name)
    if prev:
        disc.load_state_dict(prev[0])
    return disc, torch.optim.AdamW(disc.parameters(), lr=lr, betas=betas, weight_decay=0.0)


def discriminator_step(
    disc: DiscriminatorSet, opt_d, real: Tensor, fake: Tensor, precision=contextlib.nullcontext
) -> tuple[Tensor, Tensor, dict]:
    """One update of the discriminators (real against fake, detached), then the generator's losses on fake against
    the updated discriminators: -> (adversarial, feature matching, what to log, as tensors: log() reads them only on
    the steps it logs, so no step waits on the device for them). precision: a context factory."""
    with precision():
        loss_d = disc.loss(real, fake.detach())
    opt_d.zero_grad(set_to_none=True)
    loss_d.backward()
    torch.nn.utils.clip_grad_norm_(disc.parameters(), 10.0)
    opt_d.step()
    with precision():
        adv, fm = disc.generator_loss(real, fake)
    return adv, fm, {"disc": loss_d.detach(), "adv": adv.detach(), "fm": fm.detach()}


def train_vocos(
    cfg: ModelConfig, data: Data, st: VocosStage, device, log, dec_mels: dict[int, Tensor] | None = None
) -> None:
    """With --vocos-gan, adversarial training against discriminators.Discriminators (their state is the run's
    vocos_disc checkpoint): the reconstruction losses alone leave a buzzy phase that DNSMOS hears.
    With dec_mels (decoder_mels), the vocoder reads the Decoder's mels instead of the audio's own, hop-aligned."""
    torch.manual_seed(st.seed)
    g = np.random.default_rng(st.seed)
    prev = load_state(st.resume, "vocos")
    if st.grow:
        if not prev:
            raise SystemExit(
                "--vocos-grow deepens a trained vocoder: give --resume a run folder with a vocos checkpoint"
            )
        prev = (grow_vocos_layers(prev[0], cfg.vocos, st.grow, st.seed), prev[1])
        cfg = dataclasses.replace(cfg, vocos=dataclasses.replace(cfg.vocos, layers=vocos_layer_count(prev[0])))
    vocos = Vocos(cfg.vocos).to(device)
    logmel = LogMel(cfg.vocos).to(device)
    step0 = 0
    if prev:
        vocos.load_state_dict(prev[0])
        step0 = prev[1].get("step", 0)
    betas = (0.8, 0.9) if st.gan else (0.8, 0.99)
    opt = torch.optim.AdamW(vocos.parameters(), lr=st.lr, betas=betas, weight_decay=0.0)
    disc = opt_d = None
    if st.gan:
        disc, opt_d = resumed_discriminators(Discriminators(), st.resume, "vocos_disc", st.lr, betas, device)
    seg = 64 * 256 if not st.smoke else 16 * 256
    B = st.batch
    tuned, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, True  # fixed shapes: cuDNN's fastest
    wav = data.wav.to(device)
    starts, ends = data.wav_off[:-1], data.wav_off[1:]
    ok = np.flatnonzero(ends - starts > seg)
    hop, frames = cfg.vocos.hop, seg // cfg.vocos.hop + 1  # a segment's log-mel frames (centred STFT)
    if dec_mels is not None:  # frame offsets at which both the audio and the Decoder's mel hold a whole segment
        room = np.minimum((ends - starts - seg) // hop, [dec_mels[int(u)].shape[1] - frames for u in data.wav_utt])
        ok = np.flatnonzero(room >= 0)
    budget = Budget(st.minutes, st.steps)
    step = 0
    while not budget.done(step):
        idx = g.choice(ok, B)
        if dec_mels is None:
            offs = [int(g.integers(starts[i], ends[i] - seg)) for i in idx]
        else:
            offs = [int(starts[i]) + hop * int(g.integers(0, room[i] + 1)) for i in idx]
        x = torch.stack([wav[o : o + seg] for o in offs])
        set_lr(lr_at(step, budget.frac(step), st.lr, 200 if prev else 500), opt, opt_d)
        with torch.no_grad():
            mel = (
                logmel(x)
                if dec_mels is None
                else torch.stack(
                    [dec_mels[int(data.wav_utt[i])][:, (o - starts[i]) // hop :][:, :frames] for i, o in zip(idx, offs)]
                ).to(device)
            )
        with autocast(device):
            spec = vocos.spectrum(mel)
        y = vocos.istft(spec)
        n = min(y.shape[-1], x.shape[-1])
        y, xr = y[:, :n], x[:, :n]
        loss_mel, loss_stft = reconstruction_loss(logmel, y, xr)
        loss = loss_mel + loss_stft
        extra = {}
        if disc is not None:
            adv, fm, extra = discriminator_step(disc, opt_d, xr, y, lambda: autocast(device))
            loss = MEL_WEIGHT * loss + adv + fm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vocos.parameters(), 1.0 if disc is None else MEL_WEIGHT)  # same bound
        opt.step()
        if step % st.log_every == 0:
            log("vocos", step0 + step, mel_l1=loss_mel.item(), stft=loss_stft.item(), **extra)
        step += 1
    torch.backends.cudnn.benchmark = tuned  # the later stages' shapes vary from batch to batch
    save_state(Path(st.out), "vocos", vocos.state_dict(), {"step": step0 + step})
    if disc is not None:
        save_state(Path(st.out), "vocos_disc", disc.state_dict(), {"step": step0 + step})
    log("vocos", step0 + step, done=1)


# --- stage 2: DVAE (codes) -------------------------------------------------------------------------
def dvae_features(dec: DVAEDecoder, value: Tensor) -> Tensor:
    """value (B, G, T, L) -> (B, dim, T), what GFSQ.forward gives for the matching codes."""
    out = [proj(value[:, g]) for g, proj in enumerate(dec.gfsq.project_out)]
    return torch.cat(out, dim=-1).transpose(1, 2)


def mel_batch(data: Data, idx, device, frames: int | None = None, g=None) -> tuple[Tensor, Tensor]:
    """-> mel (B, 100, Fmax even) padded with the silence floor, and frame mask (B, Fmax)."""
    mels = []
    for i in idx:
        m = data.mel(i)
        if frames is not None and m.shape[1] > frames:
            o = int(g.integers(0, (m.shape[1] - frames) // 2 + 1)) * 2
            m = m[:, o : o + frames]
        mels.append(m[:, : m.shape[1] // 2 * 2])
    Fm = max(m.shape[1] for m in mels)
    out = torch.full((len(mels), mels[0].shape[0], Fm), math.log(1e-5))
    mask = torch.zeros(len(mels), Fm, dtype=torch.bool)
    for j, m in enumerate(mels):
        out[j, :, : m.shape[1]] = m
        mask[j, : m.shape[1]] = True
    return out.to(device), mask.to(device)


def train_dvae(cfg: ModelConfig, data: Data, st: DVAEStage, device, log) -> tuple[DVAEEncoder | None, DVAEDecoder]:
    torch.manual_seed(st.seed + 1)
    g = np.random.default_rng(st.seed + 1)
    enc = DVAEEncoder(cfg, hidden=64 if st.smoke else 256).to(device)
    dec = DVAEDecoder(cfg.dvae, cfg.gfsq).to(device)
    prev = load_state(st.resume, "dvae")
    if prev:
        dec.load_state_dict(sub_state(prev[0], "dec."))
        kept = sub_state(prev[0], "enc.")
        frozen = st.minutes == 0 and not st.steps
        if not kept and frozen:  # a codes pack needs only the decoder, so a run may carry just that (4 MB lighter)
            return None, dec.eval()
        if not kept:
            raise SystemExit(f"{st.resume}'s dvae checkpoint has no encoder, so the dvae stage cannot train on")
        enc.load_state_dict(kept)
        if frozen:
            return enc.eval(), dec.eval()
    params = list(enc.parameters()) + list(dec.parameters())
    opt = torch.optim.AdamW(params, lr=st.lr, weight_decay=0.0)
    budget = Budget(st.minutes, st.steps)
    step = 0
    while not budget.done(step):
        idx = g.integers(0, data.n, st.batch)
        mel, mask = mel_batch(data, idx, device, frames=256, g=g)
        set_lr(lr_at(step, budget.frac(step), st.lr, 300), opt)
        with autocast(device):
            value, digits = quantise(enc(mel), cfg.gfsq.residuals)
            pred = dec.stack(dvae_features(dec, value))
        err = (pred.float() - mel).abs().mean(1)
        loss = (err * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % st.log_every == 0:
            codes = codes_from_digits(digits)
            used = [int(torch.unique(codes[..., q][mask[:, ::2]]).numel()) for q in range(codes.shape[-1])]
            log("dvae", step, mel_l1=loss.item(), codes_used=used)
        step += 1
    state = {
        **{f"enc.{k}": v for k, v in enc.state_dict().items()},
        **{f"dec.{k}": v for k, v in dec.state_dict().items()},
    }
    save_state(Path(st.out), "dvae", state, {"step": step})
    log("dvae", step, done=1)
    return enc.eval(), dec.eval()


@torch.no_grad()
def encode_all(enc: DVAEEncoder, cfg: ModelConfig, data: Data, device, batch: int = 32) -> list[Tensor]:
    """Codes of every utterance, batched by length (padding only affects the few frames at the end)."""
    out: list[Tensor | None] = [None] * data.n
    order = np.argsort(data.frames)
    for s in range(0, data.n, batch):
        idx = order[s : s + batch]
        mel, _ = mel_batch(data, idx, device)
        with autocast(device):
            _, digits = quantise(enc(mel), cfg.gfsq.residuals)
        codes = codes_from_digits(digits).cpu()
        for b, i in enumerate(idx):
            out[i] = codes[b, : int(data.steps[i])]
    return out


# --- stage 3: GPT + Decoder ---------------------------------------------------------------------
GUIDED_LAYER, GUIDED_HEADS = 1, 2  # the layer and heads the guided-attention loss shapes (layer 2 of the voice)
STFT_FRAMES = 64  # mel frames per utterance that --decoder-stft vocodes and --decoder-gan judges (0.68 s)


def text_attention(attn, x: Tensor, cos: Tensor, sin: Tensor, text_len: Tensor, heads: int) -> Tensor:
    """The first `heads` heads' attention over text keys only: x (B, L, D) the layer's input -> (B, heads, L, L)."""
    from toolkit.models.gpt import rotate_half

    B, L, _ = x.shape
    q, k, _ = attn.wqkv(x).view(B, L, 3, attn.heads, attn.head_dim).unbind(2)
    q, k = (t.transpose(1, 2)[:, :heads] for t in (q, k))
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    is_text = torch.arange(L, device=x.device)[None] < text_len[:, None]  # keys (B, L)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(attn.head_dim)
    return scores.masked_fill(~is_text[:, None, None, :], float("-inf")).softmax(-1)


def off_diagonal_mass(att: Tensor, text_len: Tensor, code_len: Tensor, g: float = 0.2) -> Tensor:
    """Attention (B, h, L, L) over text keys -> the mean mass code-step queries put away from the text diagonal
    (weight 1 - exp(-d^2 / 2g^2) on the distance d between relative positions): the guided-attention loss."""
    L, heads = att.shape[-1], att.shape[1]
    pos = torch.arange(L, device=att.device)
    Tt, Nc = text_len[:, None], code_len[:, None]
    j = pos[None] - (Tt - 1)  # query's code step
    is_q = ((j >= 0) & (j <= Nc))[:, None, :].float()  # (B, 1, L)
    W = 1 - torch.exp(-((pos[None, None, :] / Tt[..., None] - j[..., None] / (Nc[..., None] + 1)) ** 2) / (2 * g * g))
    W = W * (pos[None] < Tt)[:, None, :]  # (B, Lq, Lk)
    per_q = (att * W[:, None]).sum(-1)  # (B, h, L)
    return (per_q * is_q).sum() / (is_q.sum() * heads)


class GuidedAttention:
    """Captures the input of one attention layer and scores its text attention against the diagonal."""

    def __init__(self, gpt: GPT, layer: int, heads: int):
        self.attn, self.heads, self.x = gpt.layers[layer].attention, heads, None
        self.attn.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        if module.training:
            self.x = args  # (x, cos, sin, mask, input_pos)

    def loss(self, text_len: Tensor, code_len: Tensor, g: float = 0.2) -> Tensor:
        return off_diagonal_mass(text_attention(self.attn, *self.x[:3], text_len, self.heads), text_len, code_len, g)


def code_loss(
    logits: Tensor, target: Tensor, eos_code: int, eos_weight: float = 1.0, row_weight: Tensor | None = None
) -> Tensor:
    """Cross-entropy of logits (M, Q, V) against target (M, Q), each EOS target weighted eos_weight: v3 reads the
    whole text, then stops late (docs/voice/MODEL_CARD.md), so the stop can be made to count more. row_weight (M,)
    weighs each position's targets too (onset_weights)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    weight = torch.where(target.reshape(-1) == eos_code, eos_weight, 1.0)
    if row_weight is not None:
        weight = weight * row_weight.repeat_interleave(target.shape[-1])
    return (ce * weight).sum() / weight.sum()


def onset_weights(T: Tensor, L: int, frames: int, weight: float) -> Tensor:
    """(B, L) loss weights: `weight` on the targets of each utterance's first `frames` audio frames, 1 elsewhere.
    Those frames are where only the speaker vector says who speaks; later, the codes already there say it, so an
    unweighted loss barely teaches the vector (a fine-tune merged new voices with m1 that way: docs/JOURNAL.md)."""
    frame = torch.arange(L, device=T.device)[None] - (T[:, None] - 1)  # the audio frame each position predicts
    return torch.where((frame >= 0) & (frame < frames), weight, 1.0)


def corrupt_codes(cod: Tensor, is_audio: Tensor, p: float, vocab: int) -> Tensor:
    """Input codes (B, L, Q) with each audio position's code replaced, with probability p, by a random non-EOS code:
    the GPT cannot predict the next code from the previous ones alone and must read the text (free-running
    generation feeds it its own imperfect codes). Targets are left as they are."""
    if p <= 0:
        return cod
    hit = (torch.rand(cod.shape, device=cod.device) < p) & is_audio[..., None]
    return torch.where(hit, torch.randint_like(cod, 0, vocab - 1), cod)


def build_batch(
    gpt: GPT,
    spk_table: nn.Parameter,
    data: Data,
    codes: list[Tensor],
    idx,
    spk_id: int,
    device,
    code_noise: float = 0.0,
):
    Q, eos = gpt.cfg.num_vq, gpt.cfg.eos_code
    T = torch.tensor([len(data.prompt(i)) for i in idx])
    N = torch.tensor([len(codes[i]) for i in idx])
    L = int((T + N).max())
    B = len(idx)
    ids = torch.zeros(B, L, dtype=torch.long)
    cod = torch.zeros(B, L, Q, dtype=torch.long)
    is_text = torch.zeros(B, L, dtype=torch.bool)
    tgt = torch.full((B, L, Q), -100, dtype=torch.long)  # target at position p predicts what comes at p+1
    for b, i in enumerate(idx):
        t, n = int(T[b]), int(N[b])
        ids[b, :t] = data.prompt(i)
        is_text[b, :t] = True
        cod[b, t : t + n] = codes[i]
        tgt[b, t - 1 : t - 1 + n] = codes[i]
        tgt[b, t - 1 + n] = eos
    ids, cod, is_text, tgt = ids.to(device), cod.to(device), is_text.to(device), tgt.to(device)
    cod = corrupt_codes(cod, ~is_text, code_noise, gpt.cfg.num_audio_tokens)
    x = gpt.embed(torch.where(is_text[..., None], ids[..., None].expand(-1, -1, Q), cod), is_text)
    spk = spk_table[torch.as_tensor([int(data.spk[i]) for i in idx], device=device)]
    x = apply_speaker(x, ids == spk_id, spk)
    return x, tgt, T.to(device), N.to(device), L


def reset_speaker_rows(
    table: Tensor, speakers: list[str], names: str, g: np.random.Generator, norm: Tensor | None = None
) -> None:
    """Draw the named voices' rows of a resumed speaker table afresh, at `norm` (default the table's mean row norm),
    for voices whose teacher changed: their old vectors ask the GPT for the old teacher's codes."""
    if norm is None:
        norm = table.norm(dim=1).mean()  # the table's as it was: each reset row would move it
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name not in speakers:
            raise SystemExit(f"--reset-speakers: {name!r} is not one of the pack's speakers {speakers}")
        row = torch.from_numpy(g.standard_normal(table.shape[1])).to(table)
        table[speakers.index(name)] = row * norm / row.norm()


def decoder_states(h: Tensor, T: Tensor, N: Tensor, L: int) -> Tensor:
    """The states the Decoder reads, (B, max N, hidden): each code's is the one it was sampled from, T-1 .. T+N-2."""
    j = torch.arange(int(N.max()), device=h.device)
    pos = (T[:, None] - 1 + j[None]).clamp(max=L - 1)
    return torch.gather(h, 1, pos[..., None].expand(-1, -1, h.shape[-1]))


def load_gpt_decoder(cfg: ModelConfig, resume: Path, device) -> tuple[GPT, ConvStack, Tensor]:
    """The GPT, Decoder and speaker table (n_speakers, hidden) of a run's gpt checkpoint, in eval mode."""
    prev = load_state(resume, "gpt")
    if prev is None:
        raise SystemExit(f"{resume} has no gpt checkpoint (gpt.json); give --resume a run folder that has one")
    cfg = run_config(cfg, prev[0])
    gpt, decoder = GPT(cfg.gpt).to(device).eval(), ConvStack(cfg.decoder).to(device).eval()
    gpt.load_state_dict(sub_state(prev[0], "gpt."))
    decoder.load_state_dict(sub_state(prev[0], "decoder."))
    return gpt, decoder, prev[0]["spk_table"].to(device)


@torch.no_grad()
def decoder_mels(
    gpt: GPT, decoder: ConvStack, table: Tensor, data: Data, device, spk_id: int, batch: int = 16
) -> dict[int, Tensor]:
    """{utterance: the Decoder's mel (100, 2N)} for every utterance with PCM, the GPT teacher-forced on its codes:
    what the vocoder hears at synthesis time, frame-aligned with the real audio."""
    if data.codes is None:
        raise SystemExit(
            "the Decoder's mels need a codes pack with PCM (corpus --codes-from VOICE --vocoder-seconds N)"
        )
    utts = [int(i) for i in data.wav_utt]
    out = {}
    for s in range(0, len(utts), batch):
        idx = utts[s : s + batch]
        with autocast(device):
            x, _, T, N, L = build_batch(gpt, table, data, data.codes, idx, spk_id, device)
            h = gpt.forward_full(x, torch.arange(L, device=device)[None] < (T + N)[:, None])
            mel = decoder(decoder_states(h, T, N, L).transpose(1, 2)).float().cpu()
        for b, i in enumerate(idx):
            out[i] = mel[b, :, : 2 * int(N[b])]
    return out


@torch.no_grad()
def code_mel_batch(dec: DVAEDecoder, codes: list[Tensor], idx, device) -> tuple[Tensor, Tensor]:
    """Mel targets decoded from codes by the DVAE decoder (a codes pack has no mels): (B, 100, 2N), mask (B, 2N)."""
    n = [len(codes[i]) for i in idx]
    batch = torch.zeros(len(idx), max(n), codes[idx[0]].shape[-1], dtype=torch.long)
    for j, i in enumerate(idx):
        batch[j, : n[j]] = codes[i]
    mel = dec(batch.transpose(1, 2).to(device)).float()
    mask = torch.arange(mel.shape[-1], device=device)[None] < 2 * torch.tensor(n, device=device)[:, None]
    return mel, mask


def train_gpt(
    cfg: ModelConfig,
    data: Data,
    codes: list[Tensor],
    st: GPTStage,
    device,
    log,
    spk_id: int,
    dvae_dec: DVAEDecoder | None = None,
    prev: tuple[dict, dict] | None = None,
):
    """prev: the resumed gpt checkpoint (state, meta), or None to start from scratch."""
    torch.manual_seed(st.seed + 2)
    g = np.random.default_rng(st.seed + 2)
    gpt = GPT(cfg.gpt).to(device)
    decoder = ConvStack(cfg.decoder).to(device)
    n_spk = len(data.info["speakers"])
    spk_table = nn.Parameter(torch.randn(n_spk, cfg.gpt.hidden, device=device))
    step0 = 0
    fresh = prev is None or st.restart_schedule
    if prev:
        gpt.load_state_dict(sub_state(prev[0], "gpt."))
        kept = sub_state(prev[0], "decoder.")
        if {k: v.shape for k, v in kept.items()} == {k: v.shape for k, v in decoder.state_dict().items()}:
            decoder.load_state_dict(kept)
        else:  # --decoder-hidden/--decoder-layers changed its size
            log(
                "gpt",
                prev[1].get("step", 0),
                decoder_fresh=1,
                decoder_hidden=cfg.decoder.hidden,
                decoder_layers=cfg.decoder.layers,
            )
        spk_table.data.copy_(prev[0]["spk_table"].to(device))
        step0 = prev[1].get("step", 0)
        reset_speaker_rows(spk_table.data, data.info["speakers"], st.reset_speakers, g)
    guided = GuidedAttention(gpt, layer=min(GUIDED_LAYER, cfg.gpt.layers - 1), heads=GUIDED_HEADS)
    vocos = None
    if st.decoder_stft > 0:  # the run's vocoder, frozen: it only scores the Decoder's mels
        prev_v = load_state(st.resume, "vocos")
        if prev_v is None:
            raise SystemExit("--decoder-stft needs a trained vocoder in --resume (a vocos checkpoint)")
        vocos = Vocos(cfg.vocos).to(device).eval().requires_grad_(False)
        vocos.load_state_dict(prev_v[0])
    disc = opt_d = None
    if st.decoder_gan > 0:  # mel-patch discriminators
        disc, opt_d = resumed_discriminators(MelDiscriminators(), st.resume, "decoder_disc", st.lr, (0.8, 0.99), device)
    # --freeze-gpt: the Decoder alone learns, from the frozen GPT's states (e.g. real mels after a codes-pack run)
    params = (
        list(decoder.parameters())
        if st.freeze_gpt
        else list(gpt.parameters()) + list(decoder.parameters()) + [spk_table]
    )
    decay = [p for p in params if p.dim() >= 2 and p is not spk_table]
    rest = [p for p in params if not (p.dim() >= 2 and p is not spk_table)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=st.lr,
        betas=(0.9, 0.98),
    )
    order = np.argsort(data.steps, kind="stable")
    steps_sorted = data.steps[order]
    budget = Budget(st.minutes, st.steps)
    max_n = int(steps_sorted[-1])
    gpt.train(), decoder.train()
    step = 0
    last_save = time.time()
    while not budget.done(step):
        frac = budget.frac(step)
        # curriculum: the longest utterance allowed grows from ~3 s to all over the first 30% (fresh runs)
        cap = max_n if not fresh else int(140 + (max_n - 140) * min(1.0, frac / 0.3))
        n_ok = max(1, int(np.searchsorted(steps_sorted, cap, side="right")))
        start = int(g.integers(0, n_ok))
        n_len = int(steps_sorted[start]) + 60
        B = max(2, min(st.batch, st.tokens // n_len))
        lo = max(0, min(start - B // 2, n_ok - B))
        idx = order[lo : lo + B]
        set_lr(lr_at(step, frac, st.lr, 300 if prev else 800), opt, opt_d)
        with autocast(device), torch.set_grad_enabled(not st.freeze_gpt):
            x, tgt, T, N, L = build_batch(gpt, spk_table, data, codes, idx, spk_id, device, st.code_noise)
            valid = torch.arange(L, device=device)[None] < (T + N)[:, None]
            h = gpt.forward_full(x, valid)
            sel = tgt[..., 0] != -100
            logits = gpt.code_logits(h[sel])  # (M, Q, V)
            onset = onset_weights(T, L, st.onset_frames, st.onset_weight)[sel] if st.onset_weight != 1 else None
            ce = code_loss(logits, tgt[sel], gpt.cfg.eos_code, st.eos_weight, onset)
            hid = decoder_states(h, T, N, L)
        with autocast(device):
            mel_pred = decoder(hid.transpose(1, 2))
            ga = guided.loss(T, N) if st.guided > 0 else torch.zeros((), device=device)
        # real mels where the pack has them; a codes-only pack's targets are its codes through the DVAE decoder
        mel, mask = mel_batch(data, idx, device) if data.has_mels else code_mel_batch(dvae_dec, codes, idx, device)
        Fm = min(mel.shape[-1], mel_pred.shape[-1])
        fmask = mask[:, :Fm] & (torch.arange(Fm, device=device)[None] < 2 * N[:, None])
        l1 = ((mel_pred[..., :Fm].float() - mel[..., :Fm]).abs().mean(1) * fmask).sum() / fmask.sum()
        ga_w = st.guided * max(0.0, 1 - frac / 0.7) if fresh else st.guided * 0.2
        loss = st.mel_weight * l1 if st.freeze_gpt else ce + st.mel_weight * l1 + ga_w * ga
        detail = torch.zeros((), device=device)
        if vocos is not None:
            detail = vocoded_stft_loss(vocos, mel_pred[..., :Fm], mel[..., :Fm], fmask, STFT_FRAMES, g)
            loss = loss + st.decoder_stft * detail
        gan = {}
        windows = (
            mel_windows(mel_pred[..., :Fm], mel[..., :Fm], fmask, STFT_FRAMES, g, st.decoder_gan_windows)
            if disc is not None
            else None
        )
        if windows is not None:
            fake, real = windows
            adv, fm, gan = discriminator_step(disc, opt_d, real, fake)
            loss = loss + st.decoder_gan * (adv + fm)
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):  # a bad batch must not poison the weights (run 2 of v1 died this way)
            log("gpt", step0 + step, skipped_nonfinite=1)
            step += 1
            continue
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        if not torch.isfinite(gn):
            log("gpt", step0 + step, skipped_nonfinite_grad=1)
            opt.zero_grad(set_to_none=True)
            step += 1
            continue
        opt.step()
        if st.save_every and time.time() - last_save > 60 * st.save_every:
            last_save = time.time()
            save_state(
                Path(st.out),
                "gpt",
                {
                    **{f"gpt.{k}": v for k, v in gpt.state_dict().items()},
                    **{f"decoder.{k}": v for k, v in decoder.state_dict().items()},
                    "spk_table": spk_table.data,
                },
                {"step": step0 + step, "partial": True},
            )
        if step % st.log_every == 0:
            with torch.no_grad():
                acc = (logits.argmax(-1) == tgt[sel]).float().mean().item()
            log(
                "gpt",
                step0 + step,
                ce=ce.item(),
                mel_l1=l1.item(),
                ga=ga.item(),
                acc=acc,
                B=len(idx),
                L=L,
                cap=cap,
                gn=float(gn),
                **({"stft": detail.item()} if vocos is not None else {}),
                **gan,
            )
        step += 1
    state = {
        **{f"gpt.{k}": v for k, v in gpt.state_dict().items()},
        **{f"decoder.{k}": v for k, v in decoder.state_dict().items()},
        "spk_table": spk_table.data,
    }
    save_state(Path(st.out), "gpt", state, {"step": step0 + step})
    if disc is not None:
        save_state(Path(st.out), "decoder_disc", disc.state_dict(), {"step": step0 + step})
    log("gpt", step0 + step, done=1)
    return gpt.eval(), decoder.eval(), spk_table.data


@torch.no_grad()
def probe(cfg, gpt, data, codes, spk_table, spk_id, device, log, n=16):
    """Free-running generation on training prompts: EOS rate and length ratio (an alignment check)."""
    from toolkit.engine import Engine
    from toolkit.sampling import SamplingParams

    eng = Engine(gpt)
    idx = np.linspace(0, data.n - 1, n).astype(int)
    T = max(len(data.prompt(i)) for i in idx)
    ids = torch.zeros(n, T, dtype=torch.long)
    valid = torch.zeros(n, T, dtype=torch.bool)
    for b, i in enumerate(idx):
        p = data.prompt(i)
        ids[b, T - len(p) :], valid[b, T - len(p) :] = p, True
    ids, valid = ids.to(device), valid.to(device)
    emb = gpt.embed(ids[..., None].expand(-1, -1, cfg.gpt.num_vq), torch.ones_like(valid))
    spk = spk_table[torch.as_tensor([int(data.spk[i]) for i in idx], device=device)]
    emb = apply_speaker(emb, ids == spk_id, spk)
    truth = torch.tensor([len(codes[i]) for i in idx])
    gen = eng.generate(emb, valid, SamplingParams(max_new_tokens=int(truth.max()) * 2 + 20), seed=0)
    ratio = gen.lengths.cpu().float() / truth.float()
    log(
        "probe",
        0,
        eos=float(gen.finished.float().mean()),
        ratio_mean=float(ratio.mean()),
        ratio_ok=float(((ratio > 0.75) & (ratio < 1.25)).float().mean()),
        ratios=[round(float(r), 2) for r in ratio],
    )
    gpt.layers.apply(lambda m: setattr(m, "kv_cache", None) if hasattr(m, "kv_cache") else None)
    gpt.key_valid = None


# --- export --------------------------------------------------------------------------------------
def export(ex: ExportConfig) -> Path:
    from toolkit.checkpoint import default_voice_first, save_ttsq
    from toolkit.models import Tokenizer, TTSModel

    tok_path = Path(ex.data) / "tokenizer.json"
    tok = Tokenizer(tok_path)
    g, d, v = load_state(ex.resume, "gpt"), load_state(ex.resume, "dvae"), load_state(ex.resume, "vocos")
    if not (g and d and v):
        raise SystemExit(f"{ex.resume} lacks one of gpt/dvae/vocos checkpoints")
    if ex.decoder_from:  # a Decoder trained apart (benchmarks/voice_decoder_h200.sh) in place of the run's own
        from safetensors.torch import load_file

        kept = {k: t for k, t in g[0].items() if not k.startswith("decoder.")}
        g = ({**kept, **{f"decoder.{k}": t.float() for k, t in load_file(str(ex.decoder_from)).items()}}, g[1])
    model = TTSModel(run_config(voice_config(tok.vocab_size, ex.smoke), g[0], vocos_state=v[0]), tok)
    model.gpt.load_state_dict(sub_state(g[0], "gpt."))
    model.decoder.load_state_dict(sub_state(g[0], "decoder."))
    model.dvae.load_state_dict(sub_state(d[0], "dec."))
    model.vocos.load_state_dict(v[0])
    table = g[0]["spk_table"].float()
    info = json.loads((Path(ex.data) / "pack.json").read_text())
    voices = {name: table[i].clone() for i, name in enumerate(info["speakers"])}
    model.voices = default_voice_first(offered_voices(voices, ex.withdraw), ex.default_voice, "--default-voice")
    model.spk_stat.copy_(torch.stack([table.std(0), table.mean(0)]))
    extra = {
        "frontend": "espeak",
        "text_head": False,  # trained on codes only: its text head cannot refine
        "voice": {
            "speakers": info["speakers"],
            **({"withdrawn": sorted(set(voices) - set(model.voices))} if ex.withdraw else {}),
            "languages": ["en", "zh"],
            "trained_steps": {"gpt": g[1]["step"], "dvae": d[1]["step"], "vocos": v[1]["step"]},
            "corpus": {k: info[k] for k in ("utterances", "train_seconds", "seed") if k in info},
        },
    }
    out = save_ttsq(
        model, ex.export, force=True, extra=extra, weights_dtype=torch.float16 if ex.export_fp16 else torch.float32
    )
    print(
        f"exported {out} ({sum(f.stat().st_size for f in Path(out).iterdir()) / 1e6:.1f} MB), "
        f"params {model.parameter_counts()}"
    )
    return out


def save_part_fp16(resume: Path, name: str, prefix: str, out: Path) -> Path:
    """The keys under `prefix` of a run's `name` checkpoint, unprefixed, as fp16 safetensors: one part of a run, light
    enough to keep beside the model card or to come back from a GPU call (benchmarks/voice_decoder_h200.sh)."""
    from safetensors.torch import save_file

    state = sub_state(load_state(resume, name)[0], prefix)
    save_file({k: v.half().contiguous() for k, v in state.items()}, str(out))
    return Path(out)


def save_encoder(resume: Path, folder: Path) -> Path:
    """The DVAE encoder of a run, in fp16 (4 MB): with the shipped voice it is all a later run needs to resume."""
    return save_part_fp16(resume, "dvae", "enc.", Path(folder) / ENCODER_FILE)


def checkpoints_from_voice(model_dir: Path, encoder: Path, out: Path, dtype: torch.dtype = torch.float16) -> None:
    """Rebuild a run's gpt/dvae/vocos checkpoints (fp16 by default, so they travel light; float32 keeps the parts a
    run leaves frozen exactly as shipped) from a ttsq voice folder and its DVAE encoder, so that training resumes
    from the shipped voice (run checkpoints are not kept in the repository)."""
    from safetensors.torch import load_file

    from toolkit.checkpoint import load_ttsq

    model = load_ttsq(Path(model_dir))
    voice = json.loads((Path(model_dir) / "manifest.json").read_text()).get("voice", {})
    steps = voice.get("trained_steps", {})
    speakers = voice["speakers"]
    table = torch.zeros(len(speakers), model.cfg.gpt.hidden)
    for i, name in enumerate(speakers):
        if name in model.voices:
            table[i] = model.voices[name].float()
    missing = [n for n in speakers if n not in model.voices]
    if missing:  # withdrawn voices: their rows drawn afresh, at the kept rows' mean norm
        norm = torch.stack(list(model.voices.values())).float().norm(dim=1).mean()
        reset_speaker_rows(table, speakers, ",".join(missing), np.random.default_rng(0), norm)
        print(f"{model_dir} lacks the voices {', '.join(missing)} (withdrawn): their speaker rows are drawn afresh")
    save_state(
        out,
        "gpt",
        {
            **{f"gpt.{k}": v for k, v in model.gpt.state_dict().items()},
            **{f"decoder.{k}": v for k, v in model.decoder.state_dict().items()},
            "spk_table": table,
        },
        {"step": steps.get("gpt", 0), "from": str(model_dir)},
        dtype,
    )
    save_state(
        out,
        "dvae",
        {
            **{f"enc.{k}": v for k, v in load_file(str(encoder)).items()},
            **{f"dec.{k}": v for k, v in model.dvae.state_dict().items()},
        },
        {"step": steps.get("dvae", 0), "from": str(model_dir)},
        dtype,
    )
    save_state(out, "vocos", model.vocos.state_dict(), {"step": steps.get("vocos", 0), "from": str(model_dir)}, dtype)


# --- main ----------------------------------------------------------------------------------------
def vocos_options(args) -> list[str]:
    """Every --vocos-* option as given, for the --parallel vocoder process (so none is dropped on the way)."""
    out = []
    for key, value in vars(args).items():
        if not key.startswith("vocos_") or value is None or value is False:
            continue
        out += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="corpus pack folder (training.voice.corpus --out DIR: DIR/pack)")
    ap.add_argument("--out", type=Path, default=Path("runs/voice"))
    ap.add_argument("--resume", type=Path, default=None, help="folder with vocos/dvae/gpt checkpoints")
    ap.add_argument("--stages", default="vocos,dvae,gpt")
    ap.add_argument("--minutes", type=float, default=8.5, help="wall-clock budget of the whole run")
    ap.add_argument("--dvae-minutes", type=float, default=None, help="default: 22%% of --minutes, 0 on resume")
    ap.add_argument("--vocos-minutes", type=float, default=None)
    ap.add_argument("--gpt-minutes", type=float, default=None)
    ap.add_argument("--vocos-steps", type=int, default=None)
    ap.add_argument("--dvae-steps", type=int, default=None)
    ap.add_argument("--gpt-steps", type=int, default=None)
    ap.add_argument("--parallel", action="store_true", help="train the vocoder in a second process")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocos-lr", type=float, default=5e-4)
    ap.add_argument("--dvae-lr", type=float, default=1e-3)
    ap.add_argument("--gpt-lr", type=float, default=6e-4)
    ap.add_argument("--vocos-batch", type=int, default=32)
    ap.add_argument(
        "--vocos-on-decoder",
        action="store_true",
        help="vocos stage: fine-tune on the Decoder's mels of the --resume'd GPT (teacher-forced on a codes "
        "pack with PCM), paired with the real audio, so that it learns the mels it gets at synthesis",
    )
    ap.add_argument(
        "--vocos-gan",
        action="store_true",
        help="vocos stage: train against multi-period and multi-resolution discriminators",
    )
    ap.add_argument("--dvae-batch", type=int, default=64)
    ap.add_argument("--gpt-batch", type=int, default=64)
    ap.add_argument("--gpt-tokens", type=int, default=24000, help="token budget per GPT batch")
    ap.add_argument("--mel-weight", type=float, default=1.0)
    ap.add_argument(
        "--code-noise",
        type=float,
        default=0.0,
        help="gpt stage: replace this share of the input audio codes by random ones (targets kept), so "
        "that the GPT reads the text instead of continuing its own codes",
    )
    ap.add_argument(
        "--reset-speakers",
        default="",
        help="gpt stage, resumed: comma-separated voices (e.g. f2,f4) whose speaker vectors start afresh, for "
        "voices whose teacher changed",
    )
    ap.add_argument(
        "--onset-weight",
        type=float,
        default=1.0,
        help="gpt stage: weight of the code loss on each utterance's first --onset-frames frames, where only the "
        "speaker vector tells the voice (above 1 teaches the vectors to matter)",
    )
    ap.add_argument("--onset-frames", type=int, default=24)
    ap.add_argument("--guided", type=float, default=1.0, help="guided-attention loss weight")
    ap.add_argument("--eos-weight", type=float, default=1.0, help="weight of the EOS target in the code loss")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--save-every", type=float, default=2.0, help="minutes between GPT checkpoints (0: end only)")
    ap.add_argument(
        "--restart-schedule",
        action="store_true",
        help="on resume, run the GPT curriculum and guided-attention schedule as if fresh",
    )
    ap.add_argument(
        "--decoder-hidden",
        type=int,
        default=None,
        help="gpt stage: the Decoder's width (default: the --resume'd one's, else 192); a new size "
        "starts the Decoder from scratch",
    )
    ap.add_argument("--decoder-layers", type=int, default=None, help="gpt stage: the Decoder's ConvNeXt blocks")
    ap.add_argument(
        "--decoder-stft",
        type=float,
        default=0.0,
        help="weight of the Decoder's detail loss: its mels and the real ones through the frozen vocoder "
        "of --resume, compared by multi-resolution STFT (0: mel L1 alone)",
    )
    ap.add_argument(
        "--decoder-gan",
        type=float,
        default=0.0,
        help="gpt stage: weight of an adversarial + feature-matching loss from mel-patch discriminators "
        "on the Decoder's output (against the over-smoothing of the L1 loss; for --freeze-gpt runs)",
    )
    ap.add_argument(
        "--decoder-gan-windows",
        type=int,
        default=1,
        help="--decoder-gan: random windows of %d mel frames judged per utterance and step" % STFT_FRAMES,
    )
    ap.add_argument(
        "--gpt-grow",
        type=int,
        default=0,
        help="gpt stage: insert this many identity blocks into the resumed GPT (deeper, same function)",
    )
    ap.add_argument(
        "--vocos-grow",
        type=int,
        default=0,
        help="vocos stage: append this many identity ConvNeXt blocks to the resumed vocoder (deeper, same function)",
    )
    ap.add_argument(
        "--freeze-gpt", action="store_true", help="gpt stage: train only the Decoder, on the frozen GPT's states"
    )
    ap.add_argument("--probe", action="store_true", help="free-running generation check at the end")
    ap.add_argument("--smoke", action="store_true", help="tiny corpus + tiny model on CPU, a few steps")
    ap.add_argument("--export", type=Path, default=None, help="write a ttsq model folder from --resume")
    ap.add_argument(
        "--export-fp16",
        action="store_true",
        help="with --export: store the weights in fp16 (half the size; they load as fp32)",
    )
    ap.add_argument(
        "--default-voice",
        default=None,
        help="with --export: the voice a synthesis uses when given no speaker (default: the first speaker "
        "of the corpus)",
    )
    ap.add_argument(
        "--withdraw-voices",
        dest="withdraw",
        default="",
        help="with --export: comma-separated voices left out of the folder, e.g. voices that missed the "
        "intelligibility goal (the manifest names them; python -m training.voice.withdraw does it to a folder)",
    )
    ap.add_argument(
        "--decoder-from",
        type=Path,
        default=None,
        help="with --export: the Decoder's weights from this safetensors file instead of --resume's",
    )
    ap.add_argument(
        "--encoder-to",
        type=Path,
        default=None,
        help="with --export: also write the run's DVAE encoder (fp16) into this folder (the exported "
        "model folder itself: `ttsq speaker from-audio` reads it there)",
    )
    ap.add_argument(
        "--from-voice",
        type=Path,
        default=None,
        help="write --out's gpt/dvae/vocos checkpoints from "
        "this ttsq voice folder and its DVAE encoder (--encoder), then stop",
    )
    ap.add_argument(
        "--encoder",
        type=Path,
        default=SHIPPED_ENCODER,
        help="the DVAE encoder of --from-voice's voice (default: the shipped voice's)",
    )
    ap.add_argument(
        "--from-voice-fp32",
        action="store_true",
        help="--from-voice writes float32 (the frozen parts stay exactly as shipped) instead of fp16",
    )
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.decoder_gan_windows < 1:
        ap.error(f"--decoder-gan-windows must be 1 or more, not {args.decoder_gan_windows}")

    if args.smoke:
        args.device = args.device or "cpu"
        args.vocos_steps = args.vocos_steps or 3
        args.dvae_steps = args.dvae_steps or 3
        args.gpt_steps = args.gpt_steps or 3
        args.vocos_batch, args.dvae_batch, args.gpt_batch, args.log_every = 2, 4, 4, 1
        if args.data is None:
            from .corpus import build

            build(args.out / "corpus", n_train=10, n_heldout=2, seed=args.seed, workers=2, vocoder_seconds=5)
            args.data = args.out / "corpus" / "pack"
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    if args.from_voice:
        return checkpoints_from_voice(
            args.from_voice, args.encoder, args.out, torch.float32 if args.from_voice_fp32 else torch.float16
        )
    if args.export and not args.stages.strip():
        out = export(stage_config(ExportConfig, args))
        if args.encoder_to:
            save_encoder(args.resume, args.encoder_to)
        return out
    if args.data is None:
        raise SystemExit("--data is required (build one with python -m training.voice.corpus --out DIR)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    stages = [s for s in args.stages.split(",") if s]
    resumed = load_state(args.resume, "gpt")
    resumed_gpt = resumed is not None
    if args.gpt_grow:
        if not resumed_gpt:
            raise SystemExit("--gpt-grow deepens a trained GPT: give --resume a run folder with a gpt checkpoint")
        widths = voice_config(1, args.smoke).gpt  # a block's shapes: no vocabulary or depth in them
        resumed = (grow_gpt_layers(resumed[0], widths, args.gpt_grow, args.seed), resumed[1])
    if not args.smoke:
        m = args.minutes
        if args.dvae_minutes is None:
            args.dvae_minutes = 0.0 if resumed_gpt else 0.22 * m
        args.vocos_minutes = args.vocos_minutes or (m if args.parallel else 0.25 * m)
        args.gpt_minutes = args.gpt_minutes or (
            m - args.dvae_minutes - (0 if args.parallel else args.vocos_minutes) - 0.4
        )
    args.out.mkdir(parents=True, exist_ok=True)
    logf = open(args.out / f"log_{'_'.join(stages)}.jsonl", "a")

    def log(stage, step, **kw):
        rec = {
            "stage": stage,
            "step": step,
            "t": round(time.time() - t0, 1),
            **{k: v.item() if isinstance(v, Tensor) else v for k, v in kw.items()},
        }
        line = json.dumps(rec)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    t0 = time.time()
    from .corpus import load_pack

    data = Data(load_pack(args.data), device)
    from toolkit.models import Tokenizer

    tok = Tokenizer(Path(args.data) / "tokenizer.json")
    spk_id, vocab = tok.token_id("[spk_emb]"), tok.vocab_size
    vocos_resumed = load_state(args.resume, "vocos")
    cfg = run_config(
        voice_config(vocab, args.smoke),
        resumed[0] if resumed else None,
        args.decoder_hidden,
        args.decoder_layers,
        vocos_resumed[0] if vocos_resumed else None,
    )
    log(
        "data",
        0,
        utterances=data.n,
        frames=int(data.mel_off[-1]),
        vocab=vocab,
        device=str(device),
        gpt_layers=cfg.gpt.layers,
    )

    child = None
    if args.parallel and "vocos" in stages:
        cmd = (
            [
                sys.executable,
                "-m",
                "training.voice.train",
                "--stages",
                "vocos",
                "--data",
                str(args.data),
                "--out",
                str(args.out),
                "--minutes",
                str(args.minutes),
                "--seed",
                str(args.seed),
                "--device",
                str(device),
                "--log-every",
                str(args.log_every),
            ]
            + (["--resume", str(args.resume)] if args.resume else [])
            + vocos_options(args)
        )
        child = subprocess.Popen(cmd)
        stages.remove("vocos")
    if "vocos" in stages:
        dec_mels = (
            decoder_mels(*load_gpt_decoder(cfg, args.resume, device), data, device, spk_id)
            if args.vocos_on_decoder
            else None
        )
        train_vocos(cfg, data, stage_config(VocosStage, args, "vocos_"), device, log, dec_mels)
    if "dvae" in stages or "gpt" in stages:
        dvae = stage_config(DVAEStage, args, "dvae_")
        enc, dec = train_dvae(cfg, data, dvae, device, log) if "dvae" in stages or resumed_gpt else (None, None)
        if dec is None:
            raise SystemExit("the gpt stage needs a DVAE: include the dvae stage or --resume a run that has one")
        if "gpt" in stages:
            if data.codes is None and enc is None:
                raise SystemExit(
                    f"{args.data} holds mels, and {args.resume}'s dvae checkpoint has no encoder to code "
                    "them: resume from a run whose dvae has one, or use a codes pack (corpus --codes-from)"
                )
            codes = data.codes if data.codes is not None else encode_all(enc, cfg, data, device)
            log("codes", 0, utterances=len(codes), seconds=round(time.time() - t0, 1))
            gpt_stage = stage_config(GPTStage, args, "gpt_")
            gpt, decoder, table = train_gpt(cfg, data, codes, gpt_stage, device, log, spk_id, dec, resumed)
            if args.probe:
                probe(cfg, gpt, data, codes, table, spk_id, device, log)
    if child is not None:
        child.wait()
    log("done", 0, seconds=round(time.time() - t0, 1))
    if args.export:
        export(stage_config(ExportConfig, argparse.Namespace(**{**vars(args), "resume": args.out})))


if __name__ == "__main__":
    main()
