"""Model registry: the networks of the papers (and tiny stand-ins) by name, with synthetic batches.

Every model is built from code with random weights (nothing is downloaded)::

    model = build_model("resnet50", device="meta")          # cheap: shapes only, no memory
    inputs, targets = make_batch("resnet50", 32)
    loss = compute_loss("resnet50", model, inputs, targets)

``family`` selects batches and losses: ``"vision"`` (``(B, C, H, W)`` images, class ids,
cross-entropy; keywords ``num_classes``, ``image_size``), ``"bert"`` (``BertForPreTraining``,
masked-LM + next-sentence loss; ``seq_len``) and ``"lm"`` (:class:`LSTMLanguageModel`, next-token
cross-entropy over all positions; ``seq_len``, ``num_classes``, ``dropout``). :func:`build_model`,
:func:`make_batch` and :func:`compute_loss` take the same keywords, each using the ones it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from repro.workload.catalog import MODEL_INFO, MODEL_NAMES, PAPER_MODELS, TINY_MODELS, ModelInfo, model_info

__all__ = ["ModelSpec", "LSTMLanguageModel", "CifarVGG16", "MODELS", "MODEL_NAMES", "PAPER_MODELS", "TINY_MODELS",
           "get_spec", "build_model", "make_batch", "compute_loss", "count_params"]


@dataclass(frozen=True)
class ModelSpec(ModelInfo):
    """How to build one named model and feed it: the catalogue's facts (:class:`ModelInfo`) and a
    ``builder(**kwargs) -> module``, called under a device context."""

    builder: Callable[..., nn.Module] = field(default=None, kw_only=True)  # type: ignore[assignment]


def _torchvision(arch: str, **fixed: Any) -> Callable[..., nn.Module]:
    def build(num_classes: int = 1000) -> nn.Module:
        import torchvision

        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **fixed)

    return build


def _timm(arch: str) -> Callable[..., nn.Module]:
    def build(num_classes: int = 1000) -> nn.Module:
        import timm

        return timm.create_model(arch, pretrained=False, num_classes=num_classes)

    return build


def _bert(hidden: int, layers: int, heads: int, intermediate: int, vocab: int = 30522,
          max_positions: int = 512) -> Callable[..., nn.Module]:
    def build(seq_len: int | None = None) -> nn.Module:
        from transformers import BertConfig, BertForPreTraining

        positions = max(max_positions, seq_len or 0)
        config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=intermediate,
                            max_position_embeddings=positions, type_vocab_size=2)
        return BertForPreTraining(config)

    return build


class _BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with batch norm and an identity (or 1x1) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class TinyResNet(nn.Module):
    """A narrow ResNet for 32x32 inputs: 3x3 stem, three stages of one basic block, linear head."""

    def __init__(self, num_classes: int = 10, widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(_BasicBlock(cin, w, stride=1 if i == 0 else 2))
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def _vgg_features(cfg: tuple[Any, ...], batch_norm: bool) -> tuple[nn.Sequential, int]:
    """3x3 convolutions (each with batch norm if asked, and ReLU) and 2x2 max-pools (``"M"``) on RGB
    input; the stack and its output channels."""
    layers: list[nn.Module] = []
    cin = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), *([nn.BatchNorm2d(v)] if batch_norm else []),
                       nn.ReLU(inplace=True)]
            cin = v
    return nn.Sequential(*layers), cin


class TinyVGG(nn.Module):
    """A narrow VGG-style net for 32x32 inputs: 3x3 convs + max-pools, then two linear layers."""

    def __init__(self, num_classes: int = 10, cfg: tuple[Any, ...] = (16, 16, "M", 32, 32, "M", 64, "M"),
                 hidden: int = 128) -> None:
        super().__init__()
        self.features, cin = _vgg_features(cfg, batch_norm=False)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.classifier = nn.Sequential(nn.Linear(cin * 16, hidden), nn.ReLU(inplace=True),
                                        nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class CifarVGG16(nn.Module):
    """VGG-16 for 32x32 CIFAR images as the OMGS-SGD authors train it: thirteen 3x3 convolutions with
    batch norm and ReLU, 2x2 max-pools, then one linear layer 512 -> classes (kuangliu/pytorch-cifar's
    CIFAR VGG, as in github.com/hclhkbu/gtopkssgd; 14,728,266 parameters for 10 classes)."""

    CFG: tuple[Any, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                            512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features, cin = _vgg_features(self.CFG, batch_norm=True)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model: embedding, stacked LSTM layers, linear decoder (untied).

    ``forward(tokens)`` maps ``(B, S)`` token ids to ``(B, S, vocab_size)`` logits from a zero hidden
    state. Each LSTM layer is its own ``nn.LSTM`` (``lstm.0``, ``lstm.1``, ...), so the module view has
    one layer per LSTM layer. Dropout on the embeddings, between layers and on the last output, as in
    PyTorch's word-language-model example.
    """

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, num_layers: int,
                 dropout: float) -> None:
        super().__init__()
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.vocab_size = vocab_size
        self.encoder = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.ModuleList(nn.LSTM(embed_dim if i == 0 else hidden, hidden, batch_first=True)
                                  for i in range(num_layers))
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab_size)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.encoder(tokens))
        for lstm in self.lstm:
            x, _ = lstm(x)
            x = self.drop(x)
        return self.decoder(x)


_BUILD_KW = ("num_classes", "seq_len", "dropout")   # the keyword arguments builders take


def _lstm_lm(vocab: int, embed_dim: int, hidden: int, layers: int,
             dropout: float) -> Callable[..., nn.Module]:
    default_dropout = dropout

    def build(num_classes: int | None = None, seq_len: int | None = None,
              dropout: float | None = None) -> nn.Module:
        p = default_dropout if dropout is None else dropout
        return LSTMLanguageModel(num_classes or vocab, embed_dim, hidden, layers, p)

    return build


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "resnet50": _torchvision("resnet50"),
    "resnet152": _torchvision("resnet152"),
    "densenet161": _torchvision("densenet161"),
    "densenet201": _torchvision("densenet201"),
    "googlenet": _torchvision("googlenet", aux_logits=False, init_weights=True, transform_input=False),
    "vgg16": _torchvision("vgg16"),
    "vgg16_cifar": CifarVGG16,
    "inception_v4": _timm("inception_v4"),
    "bert_base": _bert(768, 12, 12, 3072),
    "bert_large": _bert(1024, 24, 16, 4096),
    "lstm_ptb": _lstm_lm(10000, 1500, 1500, 2, 0.65),
    "tiny_resnet": TinyResNet,
    "tiny_vgg": TinyVGG,
    "tiny_bert": _bert(128, 2, 2, 512, vocab=1000, max_positions=128),
    "tiny_lstm": _lstm_lm(1000, 64, 64, 2, 0.0),
}

MODELS: dict[str, ModelSpec] = {name: ModelSpec(builder=_BUILDERS[name], **info.as_kwargs())
                                for name, info in MODEL_INFO.items()}


def get_spec(name: str) -> ModelSpec:
    """The registry entry for ``name``; ``ValueError`` listing the valid names if unknown."""
    return MODELS[model_info(name).name]


def _check_kwargs(spec: ModelSpec, kwargs: Mapping[str, Any]) -> None:
    bad = sorted(set(kwargs) - set(spec.kwargs))
    if bad:
        allowed = ", ".join(spec.kwargs) or "none"
        raise TypeError(f"model {spec.name!r} got unexpected keyword argument(s) {bad}; "
                        f"accepted: {allowed}")


def build_model(name: str, device: str | torch.device | None = None, **kwargs: Any) -> nn.Module:
    """Build ``name`` with random weights, in train mode. ``device="meta"`` allocates nothing."""
    spec = get_spec(name)
    _check_kwargs(spec, kwargs)
    build_kw = {k: v for k, v in kwargs.items() if k in _BUILD_KW}
    with torch.device(device if device is not None else "cpu"):
        model = spec.builder(**build_kw)
    return model.train()


def count_params(model: nn.Module) -> int:
    """Number of distinct learnable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _vision_batch(spec: ModelSpec, batch_size: int, kw: dict[str, Any], num_classes: int | None = None,
                  image_size: int | tuple[int, int] | None = None) -> tuple[Any, Any]:
    c, h, w = spec.input_size
    if image_size is not None:
        h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    classes = num_classes or spec.num_classes
    return torch.randn(batch_size, c, h, w, **kw), torch.randint(0, classes, (batch_size,), **kw)


def _bert_batch(spec: ModelSpec, batch_size: int, kw: dict[str, Any], seq_len: int | None = None,
                mask_prob: float = 0.15) -> tuple[Any, Any]:
    length = seq_len or spec.input_size[0]
    vocab = spec.num_classes
    input_ids = torch.randint(0, vocab, (batch_size, length), **kw)
    # two "sentences": segment 0, then segment 1
    token_type_ids = (torch.arange(length, device=kw["device"]) >= length // 2).long()
    token_type_ids = token_type_ids.expand(batch_size, length).contiguous()
    # masked LM: random tokens at ~15% of positions (-100: ignored)
    masked = torch.rand(batch_size, length, **kw) < mask_prob
    labels = torch.where(masked, torch.randint(0, vocab, (batch_size, length), **kw),
                         torch.full_like(input_ids, -100))
    nsp = torch.randint(0, 2, (batch_size,), **kw)
    # no attention_mask: without padding it is all ones, and checking that reads values (not on meta)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids}, {"labels": labels, "next_sentence_label": nsp}


def _lm_batch(spec: ModelSpec, batch_size: int, kw: dict[str, Any], seq_len: int | None = None,
              num_classes: int | None = None, dropout: float | None = None) -> tuple[Any, Any]:
    length = seq_len or spec.input_size[0]
    vocab = num_classes or spec.num_classes
    stream = torch.randint(0, vocab, (batch_size, length + 1), **kw)
    return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()   # next tokens


def _classifier_loss(model: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
    return F.cross_entropy(model(inputs), targets)


def _lm_loss(model: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _bert_loss(model: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
    out = model(**inputs)
    logits, nsp_logits = out.prediction_logits, out.seq_relationship_logits
    mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets["labels"].reshape(-1),
                          ignore_index=-100)
    nsp = F.cross_entropy(nsp_logits, targets["next_sentence_label"])
    return mlm + nsp


# family -> (batch function: fn(spec, batch_size, torch.randn/randint keywords, **kwargs), loss function)
_FAMILIES: dict[str, tuple[Callable[..., tuple[Any, Any]], Callable[..., torch.Tensor]]] = {
    "vision": (_vision_batch, _classifier_loss),
    "bert": (_bert_batch, _bert_loss),
    "lm": (_lm_batch, _lm_loss),
}


def make_batch(name: str, batch_size: int, device: str | torch.device = "cpu",
               generator: torch.Generator | None = None, **kwargs: Any) -> tuple[Any, Any]:
    """A synthetic ``(inputs, targets)`` batch of the right shapes for ``name``."""
    spec = get_spec(name)
    _check_kwargs(spec, kwargs)
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    device = torch.device(device)
    if device.type == "meta" or generator is None:
        return _FAMILIES[spec.family][0](spec, batch_size, {"device": device}, **kwargs)
    # drawn on the generator's device, then moved
    batch = _FAMILIES[spec.family][0](spec, batch_size, {"device": generator.device, "generator": generator}, **kwargs)
    if generator.device == device:
        return batch
    return tuple({k: v.to(device) for k, v in t.items()} if isinstance(t, dict) else t.to(device) for t in batch)


def compute_loss(name: str, model: nn.Module, inputs: Any, targets: Any, **kwargs: Any) -> torch.Tensor:
    """The training loss of ``model`` on a batch from :func:`make_batch` (a scalar tensor)."""
    spec = get_spec(name)
    _check_kwargs(spec, kwargs)
    return _FAMILIES[spec.family][1](model, inputs, targets)
