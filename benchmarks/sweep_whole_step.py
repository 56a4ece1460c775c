"""Whole-step agreement, measured: one training step of every architecture family that
transformers builds from a tiny config, simulated for a CUDA GPU and run for real on this CPU.

For each family × precision (pure bfloat16, pure float16, autocast float16, autocast bfloat16)
× target GPU (sm75 = t4, sm80 = a100, sm90 = h100):

  real       the plain PyTorch step on this CPU, without the doctor: forward, loss, backward,
             AdamW step (CPU autocast for the autocast rows). It either runs or raises.
  simulated  `dtype_doctor.diagnose(model, batch, train=True, simulate=True, device="cuda",
             gpu=…, autocast=…)`: fake tensors, CUDA's verdicts (forward, loss, backward), and
             the optimizer's step over the trainable parameters' dtypes, traced the same way.

A row agrees when the simulation's error findings are those of the real step (none for a step
that runs). Where CUDA has no kernel for a dtype the CPU runs (DD107 error: the op database's
CUDA lists and compute-capability gates, rows of the CPU↔CUDA table in
dtype_doctor/trace/cuda_table.py) the row is "expected" and listed. DD107 warnings (bfloat16
without tensor cores before sm80) are counted per config. Every other difference is listed: a
simulated error on a step that runs (false error), a real error the simulation misses
(dropped), or a trace that stopped on a simulation limit (DD001 warning: not followed). A
value-dependent branch the simulation took one way (DD001 info) is an agreement, counted apart.

Usage: python benchmarks/sweep_whole_step.py [--families bert,llama,…] [--precisions bf16,…]
       [--gpus t4,a100,h100] [--jobs 2] [--json PATH] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TORCH_LOGS", "-all")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PRECISIONS = {
    # name: (model dtype, autocast dtype)
    "bf16": ("bfloat16", None),
    "fp16": ("float16", None),
    "amp-fp16": ("float32", "float16"),
    "amp-bf16": ("float32", "bfloat16"),
}
GPUS = {"t4": "sm75", "a100": "sm80", "h100": "sm90"}

BATCH, SEQ, VOCAB = 2, 8, 128
IMAGE = 32

# Small sizes every text config understands (configs map their own names through attribute_map).
_TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB,
             max_position_embeddings=64)
_DECODER = dict(_TEXT, num_key_value_heads=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
_WAV2VEC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
                conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                vocab_size=VOCAB, mask_time_prob=0.0)


@dataclass(frozen=True)
class Family:
    name: str  # the model_type transformers knows it by
    kind: str  # text | vision | audio | seq2seq
    head: str  # the Auto class: sequence-classification | causal-lm | seq2seq-lm | image-classification | …
    config: dict = field(default_factory=dict)
    inputs: str = "ids"  # ids | pixels | audio | features | ids+decoder | segmentation


def _families() -> list[Family]:
    text_cls = [
        Family("bert", "text", "sequence-classification", _TEXT),
        Family("roberta", "text", "sequence-classification", dict(_TEXT, pad_token_id=1)),
        Family("electra", "text", "sequence-classification", dict(_TEXT, embedding_size=32)),
        # DebertaV2's default loss picks the labelled rows with nonzero(), an output shape fake tensors
        # cannot know (DD001 warning: the simulation stops there); the single-label loss is traced whole.
        Family("deberta-v2", "text", "sequence-classification", dict(_TEXT, relative_attention=True, position_buckets=8,
                                                                   pos_att_type=["p2c", "c2p"],
                                                                   problem_type="single_label_classification")),
        Family("distilbert", "text", "sequence-classification", dict(_TEXT, hidden_dim=64)),
        Family("albert", "text", "sequence-classification", dict(_TEXT, embedding_size=16)),
        Family("mpnet", "text", "sequence-classification", _TEXT),
        Family("modernbert", "text", "sequence-classification", dict(_TEXT, global_attn_every_n_layers=2, local_attention=8,
                                                                   pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                                   cls_token_id=1, sep_token_id=2)),
        Family("funnel", "text", "sequence-classification", dict(vocab_size=VOCAB, block_sizes=[1, 1], num_decoder_layers=1,
                                                               d_model=32, n_head=2, d_head=16, d_inner=64)),
        Family("squeezebert", "text", "sequence-classification", dict(_TEXT, embedding_size=32, q_groups=1, k_groups=1,
                                                                    v_groups=1, post_attention_groups=1,
                                                                    intermediate_groups=1, output_groups=1)),
    ]
    causal = [
        Family("gpt2", "text", "causal-lm", dict(_TEXT, n_positions=64)),
        Family("llama", "text", "causal-lm", _DECODER),
        Family("mistral", "text", "causal-lm", _DECODER),
        Family("qwen2", "text", "causal-lm", _DECODER),
        Family("qwen3", "text", "causal-lm", dict(_DECODER, head_dim=16)),
        Family("gemma", "text", "causal-lm", dict(_DECODER, head_dim=16)),
        Family("gemma2", "text", "causal-lm", dict(_DECODER, head_dim=16, sliding_window=8)),
        Family("phi", "text", "causal-lm", dict(_DECODER, num_key_value_heads=2)),
        Family("phi3", "text", "causal-lm", dict(_DECODER, num_key_value_heads=2)),
        Family("opt", "text", "causal-lm", dict(_TEXT, ffn_dim=64, word_embed_proj_dim=32)),
        Family("gpt_neox", "text", "causal-lm", _TEXT),
        Family("falcon", "text", "causal-lm", dict(_TEXT, new_decoder_architecture=False, multi_query=True)),
        Family("bloom", "text", "causal-lm", dict(_TEXT, n_head=2)),
        Family("mpt", "text", "causal-lm", dict(d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, vocab_size=VOCAB,
                                               max_seq_len=64)),
        Family("gptj", "text", "causal-lm", dict(_TEXT, n_positions=64, rotary_dim=8)),
        Family("stablelm", "text", "causal-lm", dict(_DECODER, num_key_value_heads=2)),
        Family("starcoder2", "text", "causal-lm", dict(_DECODER)),
        Family("olmo2", "text", "causal-lm", dict(_DECODER)),
        Family("mixtral", "text", "causal-lm", dict(_DECODER, num_local_experts=2, num_experts_per_tok=1)),
        Family("gpt_bigcode", "text", "causal-lm", dict(_TEXT, n_positions=64)),
    ]
    seq2seq = [
        Family("t5", "seq2seq", "seq2seq-lm", dict(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                                   decoder_start_token_id=0), "ids+labels"),
        Family("bart", "seq2seq", "seq2seq-lm", _SEQ2SEQ, "ids+labels"),
        Family("marian", "seq2seq", "seq2seq-lm", _SEQ2SEQ, "ids+labels"),
        Family("pegasus", "seq2seq", "seq2seq-lm", _SEQ2SEQ, "ids+labels"),
        Family("whisper", "audio", "speech-seq2seq", dict(_SEQ2SEQ, num_mel_bins=8, max_source_positions=16,
                                                          max_target_positions=64, decoder_start_token_id=2,
                                                          suppress_tokens=[], begin_suppress_tokens=[]), "features+labels"),
    ]
    vision = [
        Family("vit", "vision", "image-classification", dict(_TEXT, image_size=IMAGE, patch_size=8), "pixels"),
        Family("deit", "vision", "image-classification", dict(_TEXT, image_size=IMAGE, patch_size=8,
                                                             architectures=["DeiTForImageClassification"]), "pixels"),
        Family("beit", "vision", "image-classification", dict(_TEXT, image_size=IMAGE, patch_size=8, use_relative_position_bias=True), "pixels"),
        Family("dinov2", "vision", "image-classification", dict(_TEXT, image_size=IMAGE, patch_size=8), "pixels"),
        Family("swin", "vision", "image-classification", dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                                                              num_heads=[1, 2], window_size=4), "pixels"),
        Family("convnext", "vision", "image-classification", dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2), "pixels"),
        Family("resnet", "vision", "image-classification", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]), "pixels"),
        Family("mobilenet_v2", "vision", "image-classification", dict(image_size=IMAGE, depth_multiplier=0.25), "pixels"),
        Family("poolformer", "vision", "image-classification", dict(hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2,
                                                                    patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
                                                                    pool_size=3), "pixels"),
        Family("clip", "vision", "image-classification", dict(vision_config=dict(_TEXT, image_size=IMAGE, patch_size=8),
                                                              text_config=dict(_TEXT)), "pixels"),
        Family("segformer", "vision", "semantic-segmentation", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                                    hidden_sizes=[8, 16], num_attention_heads=[1, 2],
                                                                    patch_sizes=[7, 3], strides=[4, 2], decoder_hidden_size=16,
                                                                    num_labels=3), "segmentation"),
    ]
    audio = [
        Family("wav2vec2", "audio", "audio-classification", dict(_WAV2VEC, feat_extract_norm="group"), "audio"),
        Family("hubert", "audio", "audio-classification", dict(_WAV2VEC, feat_extract_norm="group"), "audio"),
        Family("wavlm", "audio", "audio-classification", dict(_WAV2VEC, feat_extract_norm="layer", num_buckets=16,
                                                              max_bucket_distance=32), "audio"),
        Family("data2vec-audio", "audio", "audio-classification", dict(_WAV2VEC, feat_extract_norm="layer"), "audio"),
    ]
    # State-space and hybrid decoders (issue 39): their slow torch paths, no mamba_ssm kernels.
    _mamba2 = dict(num_heads=8, head_dim=8, n_groups=1, chunk_size=8)
    ssm = [
        Family("mamba", "text", "causal-lm", dict(vocab_size=VOCAB, hidden_size=32, state_size=16, num_hidden_layers=2,
                                                 expand=2, conv_kernel=4, pad_token_id=0)),
        Family("falcon_mamba", "text", "causal-lm", dict(vocab_size=VOCAB, hidden_size=32, state_size=16, num_hidden_layers=2,
                                                        expand=2, conv_kernel=4, pad_token_id=0, use_mambapy=False)),
        Family("mamba2", "text", "causal-lm", dict(vocab_size=VOCAB, hidden_size=32, state_size=16, num_hidden_layers=2,
                                                  expand=2, conv_kernel=4, pad_token_id=0, **_mamba2)),
        Family("jamba", "text", "causal-lm", dict(_DECODER, num_experts=2, num_experts_per_tok=1, attn_layer_period=2,
                                                 attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                                                 mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                                                 use_mamba_kernels=False)),
        Family("bamba", "text", "causal-lm", dict(_DECODER, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16,
                                                 mamba_n_groups=1, mamba_chunk_size=8, attn_layer_indices=[1])),
        Family("falcon_h1", "text", "causal-lm", dict(_DECODER, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16,
                                                     mamba_n_groups=1, mamba_chunk_size=8, mamba_d_ssm=64, head_dim=16)),
    ]
    return text_cls + causal + seq2seq + vision + audio + ssm


FAMILIES = {f.name: f for f in _families()}

# The one error a simulated step may add to a clean CPU step: DD107, a dtype the target GPU has no
# kernel for (op_db's CUDA lists and their compute-capability gates: rows 1 and 2 of the CPU↔CUDA
# table in dtype_doctor/trace/cuda_table.py). Listed as "expected", with its message.
CUDA_DIFFERS = frozenset({"DD107"})


# ------------------------------------------------------------------------ building


def build(family: Family, dtype: str):
    import torch
    import transformers
    from transformers import AutoConfig

    auto = {
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
        "speech-seq2seq": transformers.AutoModelForSpeechSeq2Seq,
        "image-classification": transformers.AutoModelForImageClassification,
        "semantic-segmentation": transformers.AutoModelForSemanticSegmentation,
        "audio-classification": transformers.AutoModelForAudioClassification,
    }[family.head]
    torch.manual_seed(0)
    config = AutoConfig.for_model(family.name, **family.config)
    if family.head in ("sequence-classification", "image-classification", "audio-classification"):
        config.num_labels = 3
    model = auto.from_config(config, dtype=getattr(torch, dtype))
    model.train()
    return model


def batch(family: Family, model: Any, dtype: str) -> dict[str, Any]:
    """A batch as a correct pipeline passes it: ids int64, floating inputs in the model's dtype."""
    import torch

    g = torch.Generator().manual_seed(0)
    floating = getattr(torch, dtype)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    config = model.config
    if family.inputs == "ids":
        labels = ids.clone() if family.head == "causal-lm" else torch.tensor([0, 2])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    if family.inputs == "ids+labels":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)}
    if family.inputs in ("pixels", "segmentation"):
        vision = getattr(config, "vision_config", config)
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.randn(BATCH, channels, IMAGE, IMAGE, generator=g).to(floating)
        labels = torch.randint(0, 3, (BATCH, IMAGE, IMAGE), generator=g) if family.inputs == "segmentation" else torch.tensor([0, 2])
        return {"pixel_values": pixels, "labels": labels}
    if family.inputs == "audio":
        return {"input_values": torch.randn(BATCH, 400, generator=g).to(floating), "labels": torch.tensor([0, 2])}
    if family.inputs == "features+labels":
        frames = 2 * config.max_source_positions
        return {"input_features": torch.randn(BATCH, config.num_mel_bins, frames, generator=g).to(floating),
                "labels": torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)}
    raise ValueError(family.inputs)


# ------------------------------------------------------------------------ the two sides


@dataclass
class Outcome:
    errors: tuple[str, ...] = ()  # error-level findings: "DD100 aten.native_layer_norm_backward: …"
    limits: tuple[str, ...] = ()  # where the simulation stopped (DD001 warning, or an incomplete step)
    assumed: tuple[str, ...] = ()  # value-dependent branches the simulation took one way (DD001 info)
    cuda_warnings: tuple[str, ...] = ()  # DD107 warnings: what runs on the target GPU, slowly
    raised: str | None = None  # the real step's exception (first line)
    seconds: float = 0.0


def real_step(model: Any, inputs: dict, autocast: str | None) -> Outcome:
    """The plain PyTorch step on this CPU: forward, loss, backward, AdamW step (foreach kernels,
    as AdamW takes them by default on CUDA)."""
    import torch

    from dtype_doctor.numerics import loss_of

    start = time.perf_counter()
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=True)
    amp = torch.autocast("cpu", dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext()
    try:
        with amp:
            out = model(**inputs)
        loss = loss_of(out, "sum")
        loss.backward()
        opt.step()
    except Exception as exc:  # noqa: BLE001 - the step's verdict
        return Outcome(raised=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", seconds=time.perf_counter() - start)
    return Outcome(seconds=time.perf_counter() - start)


def simulated_step(model: Any, inputs: dict, autocast: str | None, gpu: str) -> Outcome:
    """diagnose(train=True, simulate=True) for forward, loss and backward, then the optimizer's step."""
    import dtype_doctor
    from dtype_doctor.records import coverage_of

    start = time.perf_counter()
    report = dtype_doctor.diagnose(model, inputs, train=True, simulate=True, device="cuda", gpu=gpu, autocast=autocast)
    errors = [_line(f) for f in report.findings if f.severity == "error"]
    limits = [_line(f) for f in report.findings if f.code == "DD001" and f.severity == "warning"]
    assumed = [_line(f) for f in report.findings if f.code == "DD001" and f.severity == "info"]
    cuda_warnings = tuple(_line(f) for f in report.findings if f.code in CUDA_DIFFERS and f.severity == "warning")
    coverage = coverage_of(report.trace)
    if not coverage.complete and not errors and not limits:
        limits.append(f"incomplete step: {coverage.stopped or 'missing ' + ', '.join(coverage.missing)}")
    step = simulated_optimizer_step(model, gpu)
    errors += [f"optimizer: {e}" for e in step.errors]
    limits += [f"optimizer: {e}" for e in step.limits]
    return Outcome(errors=tuple(errors), limits=tuple(limits), assumed=tuple(assumed), cuda_warnings=cuda_warnings,
                   seconds=time.perf_counter() - start)


def simulated_optimizer_step(model: Any, gpu: str) -> Outcome:
    """AdamW's step (foreach, as CUDA takes it by default) over fake copies of the trainable
    parameters with gradients of their dtype, each op judged by the same kernel probe."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dtype_doctor.diagnosis import report_from_trace
    from dtype_doctor.machine import decide
    from dtype_doctor.trace.request import TraceRequest
    from dtype_doctor.trace.engine import fake_like, model_info
    from dtype_doctor.trace.session import TraceSession

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    params = [fake_like(mode, p, torch.device("meta")) for p in model.parameters() if p.requires_grad]
    with mode:
        for p in params:
            p.grad = torch.empty_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    session = TraceSession(model, placement=decide("cuda", simulate=True, gpu=gpu), alias={"meta": "cuda:0"})
    failure = None
    with mode:
        session.start()
        try:
            optimizer.step()
        except Exception as exc:  # noqa: BLE001 - a failed step is a finding
            failure = session.failure(exc)
        finally:
            session.stop()
    trace = session.trace(model_info(model), failure, values="not measured: fake tensors")
    report = report_from_trace(trace, model, TraceRequest(placement=decide("cuda", simulate=True, gpu=gpu)))
    errors = tuple(_line(f) for f in report.findings if f.severity == "error")
    limits = tuple(_line(f) for f in report.findings if f.code == "DD001" and f.severity == "warning")
    return Outcome(errors=errors, limits=limits)


def _line(f: Any) -> str:
    return f"{f.code} {f.op or f.module or '-'}: {f.message.splitlines()[0][:240]}"


# ------------------------------------------------------------------------ the sweep


@dataclass
class Row:
    family: str
    kind: str
    precision: str
    gpu: str
    real: Outcome
    simulated: Outcome
    verdict: str  # agree | expected | false-error | dropped | not-followed | build-failed
    detail: str = ""


def judge(family: Family, precision: str, gpu: str, real: Outcome, sim: Outcome) -> tuple[str, str]:
    """The row's verdict: agree (the simulation's errors are the real step's: none for a step
    that runs), expected (they differ where CUDA differs: CUDA_DIFFERS), false-error, dropped,
    or not-followed (the simulation stopped before the step's end)."""
    if real.raised is None:
        unexplained = [e for e in sim.errors if e.split()[0] not in CUDA_DIFFERS]
        if unexplained:
            return "false-error", "; ".join(unexplained)
        if sim.errors:
            return "expected", "; ".join(sim.errors)
        if sim.limits:
            return "not-followed", "; ".join(sim.limits)
        return "agree", "; ".join(sim.assumed)
    if sim.errors:
        return "agree", f"real: {real.raised}; simulated: {'; '.join(sim.errors)}"
    if sim.limits:
        return "not-followed", f"real: {real.raised}; simulated: {'; '.join(sim.limits)}"
    return "dropped", f"real: {real.raised}"


def sweep_family(name: str, precisions: list[str], gpus: list[str]) -> tuple[list[Row], list[str]]:
    """One family's rows, and its log lines (one per precision)."""
    family = FAMILIES[name]
    rows: list[Row] = []
    lines: list[str] = []
    for precision in precisions:
        dtype, autocast = PRECISIONS[precision]
        try:
            model = build(family, dtype)
            inputs = batch(family, model, dtype)
        except Exception as exc:  # noqa: BLE001 - a config this transformers cannot build is listed
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            rows += [Row(family.name, family.kind, precision, gpu, Outcome(), Outcome(), "build-failed", detail) for gpu in gpus]
            lines.append(f"{family.name:16} {precision:9} build failed: {detail}")
            continue
        sims = {gpu: simulated_step(model, inputs, autocast, gpu) for gpu in gpus}
        real = real_step(model, inputs, autocast)
        for gpu in gpus:
            verdict, detail = judge(family, precision, gpu, real, sims[gpu])
            rows.append(Row(family.name, family.kind, precision, gpu, real, sims[gpu], verdict, detail))
        verdicts = " ".join(f"{g}:{r.verdict}" for g, r in zip(gpus, rows[-len(gpus):]))
        lines.append(f"{family.name:16} {precision:9} real {'raises' if real.raised else 'runs  '} {verdicts}"
                     f"  ({real.seconds:.1f}s real, {sum(s.seconds for s in sims.values()):.1f}s simulated)")
    return rows, lines


def sweep(names: list[str], precisions: list[str], gpus: list[str], jobs: int = 1, log: Callable[[str], None] = print) -> list[Row]:
    """Every family's rows, in `names` order; `jobs` processes share the families."""
    if jobs <= 1:
        rows: list[Row] = []
        for name in names:
            found, lines = sweep_family(name, precisions, gpus)
            rows += found
            for line in lines:
                log(line)
        return rows
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    by_family: dict[str, list[Row]] = {}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet) as pool:
        futures = {pool.submit(sweep_family, name, precisions, gpus): name for name in names}
        from concurrent.futures import as_completed

        for future in as_completed(futures):
            found, lines = future.result()
            by_family[futures[future]] = found
            for line in lines:
                log(line)
    return [row for name in names for row in by_family[name]]


def _quiet() -> None:
    """A process of the sweep: no library chatter, one thread (the tensors are tiny)."""
    warnings.filterwarnings("ignore")
    import logging

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    torch.set_num_threads(1)


def summary(rows: list[Row], seconds: float) -> str:
    families = sorted({r.family for r in rows})
    configs = sorted({(r.precision, r.gpu) for r in rows})
    counts = Counter(r.verdict for r in rows)
    kinds = Counter(r.kind for r in rows if (r.precision, r.gpu) == configs[0]) if configs else Counter()
    lines = [
        "",
        f"whole-step sweep: {len(families)} families ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}) × "
        f"{len(configs)} configs ({len({p for p, _ in configs})} precisions × {len({g for _, g in configs})} GPUs) = {len(rows)} steps, "
        f"{seconds:.0f} s",
    ]
    lines.append("  " + ", ".join(f"{v}: {counts[v]}" for v in ("agree", "expected", "false-error", "dropped", "not-followed", "build-failed")))
    warned = Counter((r.precision, r.gpu) for r in rows if r.simulated.cuda_warnings)
    if warned:
        lines.append("  steps with DD107 warnings (runs on that GPU, slowly): "
                     + ", ".join(f"{p}/{g}: {n}" for (p, g), n in sorted(warned.items())))
    clean = [r for r in rows if r.real.raised is None and r.verdict != "build-failed"]
    lines.append(f"  real step clean in {len(clean)}; simulated errors on those: "
                 f"{sum(1 for r in clean if r.verdict == 'false-error')} unexplained, {sum(1 for r in clean if r.verdict == 'expected')} documented CUDA differences")
    # The figure: families down, configs across.
    mark = {"agree": ".", "expected": "e", "false-error": "F", "dropped": "D", "not-followed": "?", "build-failed": "b"}
    header = " ".join(f"{p}/{g}" for p, g in configs)
    lines += ["", f"{'family':16} {header}"]
    by = {(r.family, r.precision, r.gpu): r for r in rows}
    for fam in families:
        cells = []
        for p, g in configs:
            r = by.get((fam, p, g))
            sign = "a" if r and r.verdict == "agree" and r.simulated.assumed else (mark[r.verdict] if r else " ")
            cells.append(sign.center(len(f"{p}/{g}")))
        lines.append(f"{fam:16} {' '.join(cells)}")
    lines.append("  . agree   a agree, a value-dependent branch taken one way (DD001 info)   e documented CUDA difference\n"
                 "  F simulated error, real step runs   D real error missed   ? simulation stopped (DD001)   b not buildable")
    bad = [r for r in rows if r.verdict not in ("agree",)]
    if bad:
        lines += ["", "disagreements:"]
        for r in bad:
            lines.append(f"  {r.family}/{r.precision}/{r.gpu} [{r.verdict}] {r.detail}")
    assumed = Counter(a for r in rows if r.verdict == "agree" for a in r.simulated.assumed)
    if assumed:
        lines += ["", "value-dependent branches the simulation took one way (DD001 info), rows:"]
        lines += [f"  {n:3} {a}" for a, n in assumed.most_common()]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="", help="comma-separated model types (default: all); --list shows them")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated, of {', '.join(PRECISIONS)}")
    p.add_argument("--gpus", default=",".join(GPUS), help=f"comma-separated --gpu profiles, of {', '.join(GPUS)}")
    p.add_argument("--json", default="", help="write every row there")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes sharing the families (default: 2, or 1 on one CPU)")
    p.add_argument("--list", action="store_true", help="list the families and exit")
    a = p.parse_args()
    if a.list:
        for f in FAMILIES.values():
            print(f"{f.name:16} {f.kind:8} {f.head}")
        return 0
    _quiet()
    names = [n for n in a.families.split(",") if n] or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        p.error(f"unknown families: {', '.join(unknown)} (--list shows them)")
    start = time.perf_counter()
    rows = sweep(names, [x for x in a.precisions.split(",") if x], [x for x in a.gpus.split(",") if x], jobs=a.jobs)
    seconds = time.perf_counter() - start
    print(summary(rows, seconds))
    if a.json:
        Path(a.json).write_text(json.dumps([{
            "family": r.family, "kind": r.kind, "precision": r.precision, "gpu": r.gpu, "verdict": r.verdict, "detail": r.detail,
            "real": r.real.raised, "simulated_errors": list(r.simulated.errors), "simulated_limits": list(r.simulated.limits),
            "simulated_assumed": list(r.simulated.assumed), "simulated_cuda_warnings": list(r.simulated.cuda_warnings),
        } for r in rows], indent=1))
    failed = sum(1 for r in rows if r.verdict in ("false-error", "dropped"))
    print("BENCH-RESULT " + json.dumps({"name": "sweep_whole_step", "families": len({r.family for r in rows}),
                                        "steps": len(rows), "disagreements": failed, "ok": failed == 0}))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
