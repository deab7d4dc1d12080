"""The model catalogue: every model name the registry knows, with what can be said without torch.

:mod:`repro.workload.models` builds its registry (``MODELS``) from this table, adding a builder per
name; this module never imports torch, so ``repro models`` and ``repro train --help`` can list the
models (and a command can refuse an unknown name) without paying for torch's import.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

__all__ = ["ModelInfo", "MODEL_INFO", "MODEL_NAMES", "PAPER_MODELS", "TINY_MODELS", "model_info"]


@dataclass(frozen=True)
class ModelInfo:
    """What a model is, without building it."""

    name: str
    family: str                      # "vision" | "bert" | "lm" (selects batch and loss functions)
    input_size: tuple[int, ...]      # vision: (C, H, W); bert, lm: (seq_len,)
    num_classes: int                 # vision: classes; bert, lm: vocabulary size
    paper_batch_size: int | None     # per-GPU batch size of the paper we reproduce (None: no paper)
    paper_batch_sizes: Mapping[str, int] = field(default_factory=dict)  # source -> batch size
    source: str = ""                 # where the architecture comes from
    tiny: bool = False               # a CPU-sized stand-in, not a paper model
    kwargs: tuple[str, ...] = ()     # keyword arguments accepted by build/batch/loss

    def as_kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments (for :class:`repro.workload.models.ModelSpec`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_VISION_KW = ("num_classes", "image_size")
_BERT_KW = ("seq_len",)
_LM_KW = ("seq_len", "num_classes", "dropout")
_MGWFBP_J = "mgwfbp-journal"   # MG-WFBP journal version, 16 V100
_MGWFBP_C = "mgwfbp-conf"      # MG-WFBP conference version, K80 cluster
_DEAR = "dear"                 # DeAR, 64 GPUs
_OMGS = "omgs"                 # OMGS-SGD, 16 P102-100

MODEL_INFO: dict[str, ModelInfo] = {s.name: s for s in [
    ModelInfo("resnet50", "vision", (3, 224, 224), 1000, 32,
              {_MGWFBP_C: 32, _DEAR: 64, _OMGS: 32}, "torchvision", kwargs=_VISION_KW),
    ModelInfo("resnet152", "vision", (3, 224, 224), 1000, 128,
              {_MGWFBP_J: 128}, "torchvision", kwargs=_VISION_KW),
    ModelInfo("densenet161", "vision", (3, 224, 224), 1000, 64,
              {_MGWFBP_J: 64}, "torchvision", kwargs=_VISION_KW),
    ModelInfo("densenet201", "vision", (3, 224, 224), 1000, 64,
              {_MGWFBP_J: 64, _DEAR: 32}, "torchvision", kwargs=_VISION_KW),
    ModelInfo("googlenet", "vision", (3, 224, 224), 1000, 64, {_MGWFBP_C: 64}, "torchvision (no auxiliary heads)",
              kwargs=_VISION_KW),
    # VGG-16's batch size in MG-WFBP is not stated with it; 32 is our interpretation.
    ModelInfo("vgg16", "vision", (3, 224, 224), 1000, 32,
              {"interpretation": 32}, "torchvision (no batch norm)", kwargs=_VISION_KW),
    # OMGS-SGD: "VGG-16 (CIFAR-10, batch 32)": the authors' CIFAR VGG-16 (see CifarVGG16).
    ModelInfo("vgg16_cifar", "vision", (3, 32, 32), 10, 32, {_OMGS: 32},
              "repro.workload.models (CIFAR VGG-16 with batch norm, one 512->10 linear layer, as in the "
              "OMGS-SGD authors' code)", kwargs=_VISION_KW),
    # Inception-v4 in OMGS-SGD: the paper summary gives no batch size; 64 is the default of the
    # authors' public script (HKBU-HPML/OMGS-SGD, exp_configs/inceptionv4.conf).
    ModelInfo("inception_v4", "vision", (3, 299, 299), 1000, 128,
              {_MGWFBP_J: 128, _DEAR: 64, _OMGS: 64}, "timm", kwargs=_VISION_KW),
    ModelInfo("bert_base", "bert", (64,), 30522, 64,
              {_DEAR: 64}, "transformers BertForPreTraining (BERT-Base config)", kwargs=_BERT_KW),
    ModelInfo("bert_large", "bert", (64,), 30522, 32,
              {_DEAR: 32}, "transformers BertForPreTraining (BERT-Large config)", kwargs=_BERT_KW),
    # OMGS-SGD: "2-layer LSTM with 1500 hidden units on Penn Treebank (batch 20)". Embedding 1500,
    # vocabulary 10000 (PTB's), dropout 0.65, sequence length 35 and untied weights are our
    # interpretation (PyTorch word-language-model example, "large" configuration).
    ModelInfo("lstm_ptb", "lm", (35,), 10000, 20,
              {_OMGS: 20}, "repro.workload.models (2-layer LSTM LM, hidden 1500, embedding 1500, vocab 10000)",
              kwargs=_LM_KW),
    ModelInfo("tiny_resnet", "vision", (3, 32, 32), 10, None, {}, "repro.workload.models",
              tiny=True, kwargs=_VISION_KW),
    ModelInfo("tiny_vgg", "vision", (3, 32, 32), 10, None, {}, "repro.workload.models",
              tiny=True, kwargs=_VISION_KW),
    ModelInfo("tiny_bert", "bert", (32,), 1000, None, {},
              "transformers BertForPreTraining (2 layers, hidden 128, vocab 1000)", tiny=True, kwargs=_BERT_KW),
    ModelInfo("tiny_lstm", "lm", (16,), 1000, None, {},
              "repro.workload.models (2-layer LSTM LM, hidden 64, embedding 64, vocab 1000, no dropout)",
              tiny=True, kwargs=_LM_KW),
]}

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_INFO)
PAPER_MODELS: tuple[str, ...] = tuple(n for n, s in MODEL_INFO.items() if not s.tiny)
TINY_MODELS: tuple[str, ...] = tuple(n for n, s in MODEL_INFO.items() if s.tiny)


def model_info(name: str) -> ModelInfo:
    """The catalogue entry for ``name``; ``ValueError`` listing the valid names if unknown."""
    info = MODEL_INFO.get(name)
    if info is None:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}")
    return info
