"""COMET's regression network on transformers' XLMRobertaModel: the encoder's layers mixed by
learned scalar weights, averaged over the real tokens, the feature vector of the translation's,
reference's and source's embeddings, and the feed-forward estimator. Computes what
unbabel-comet's RegressionMetric computes in inference (its dropouts are identities there)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...numerics import one_mkl_thread


def sparsemax(weights: torch.Tensor) -> torch.Tensor:
    """Sparsemax over a vector (Martins and Astudillo, 2016): the Euclidean projection onto the
    simplex, which gives some layers a weight of exactly 0 (wmt22-comet-da mixes its layers so)."""
    z, _ = torch.sort(weights, descending=True)
    k = torch.arange(1, z.numel() + 1, dtype=weights.dtype, device=weights.device)
    cumulative = torch.cumsum(z, dim=0)
    support = (1 + k * z) > cumulative
    k_max = int(support.nonzero().max()) + 1
    tau = (cumulative[k_max - 1] - 1) / k_max
    return torch.clamp(weights - tau, min=0)


class LayerMix(nn.Module):
    """gamma * sum_i w_i * h_i over the embedding output and every layer's output, w = softmax or
    sparsemax of the scalar parameters, each h_i optionally normalized over the real tokens."""

    def __init__(self, num_layers: int, transformation: str, layer_norm: bool) -> None:
        super().__init__()
        self.scalar_parameters = nn.ParameterList([nn.Parameter(torch.zeros(1)) for _ in range(num_layers)])
        self.gamma = nn.Parameter(torch.ones(1))
        self.transformation = transformation
        self.layer_norm = layer_norm

    def weights(self) -> torch.Tensor:
        weights = torch.cat(list(self.scalar_parameters))
        return sparsemax(weights) if self.transformation == "sparsemax" else torch.softmax(weights, dim=0)

    def forward(self, layers: Sequence[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        normed = self.weights()
        mask_float = mask.float()
        broadcast = mask_float.unsqueeze(-1)
        total: Any = 0  # summed in layer order, as COMET's sum(pieces)
        # Layers above the encoder's last (dropped by drop_unused_layers) have weight 0: zip stops.
        for weight, h in zip(torch.split(normed, 1), layers):
            total = total + weight * (_masked_layer_norm(h, broadcast, mask_float) if self.layer_norm else h)
        return self.gamma * total


def _masked_layer_norm(h: torch.Tensor, broadcast: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean and variance over every real token's every unit of one example."""
    batch, _, dim = h.size()
    count = mask.sum(1) * dim
    masked = h * broadcast
    # Over the units, then over the tokens: one sum over a whole example's units (view(batch, -1)
    # .sum(1)) is, for a batch of one, a sum to a single value, which torch splits among the
    # threads once it has 32768 terms, so its rounding would follow the thread count. Summed per
    # token first, every sum has one owner whatever the threads.
    mean = (masked.sum(2).sum(1) / count).view(batch, 1, 1)
    variance = (((masked - mean) * broadcast) ** 2).sum(2).sum(1) / count
    return (h - mean) / torch.sqrt(variance + 1e-12).view(batch, 1, 1)


def _activation(name: str) -> nn.Module:
    # COMET's FeedForward.build_activation: torch.nn's class of that name, title-cased.
    cls = getattr(nn, name.title(), None)
    if cls is None:
        raise ValueError(f"activation {name!r} is not a torch.nn module")
    return cls()


def feed_forward(in_dim: int, hidden_sizes: Sequence[int], activations: str, final_activation: str | None) -> nn.Sequential:
    """COMET's FeedForward's `ff`: an nn.Sequential with the same indices, its dropouts as identities."""
    modules: list[nn.Module] = []
    sizes = [in_dim, *hidden_sizes]
    for a, b in zip(sizes, sizes[1:]):
        modules += [nn.Linear(a, b), _activation(activations), nn.Identity()]
    modules.append(nn.Linear(sizes[-1], 1))
    if final_activation is not None:
        modules.append(_activation(final_activation))
    return nn.Sequential(*modules)


def encoder_class(hparams: Mapping[str, Any]) -> tuple[Any, Any]:
    """(config class, model class) of hparams' encoder_model, as COMET's str2encoder picks them."""
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaXLConfig, XLMRobertaXLModel

    if hparams.get("encoder_model", "XLM-RoBERTa") == "XLM-RoBERTa-XL":
        return XLMRobertaXLConfig, XLMRobertaXLModel
    return XLMRobertaConfig, XLMRobertaModel


class RegressionNetwork(nn.Module):
    """The published RegressionMetric's parameters under the same names (`encoder.model.*`,
    `layerwise_attention.*`, `estimator.ff.*`), so its state dict loads as it is."""

    def __init__(self, encoder_config: Any, hparams: Mapping[str, Any], pad_token_id: int) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.xl = hparams.get("encoder_model") == "XLM-RoBERTa-XL"
        self.encoder.model = encoder_class(hparams)[1](encoder_config, add_pooling_layer=False)
        self.pool = hparams.get("pool", "avg")
        self.layer = hparams.get("layer", "mix")
        self.pad_token_id = pad_token_id
        num_layers = encoder_config.num_hidden_layers + 1
        self.layerwise_attention = (
            LayerMix(num_layers, str(hparams.get("layer_transformation", "softmax")), bool(hparams.get("layer_norm", False)))
            if self.layer == "mix" else None
        )
        self.estimator = nn.Module()
        self.estimator.ff = feed_forward(encoder_config.hidden_size * 6, list(hparams.get("hidden_sizes", [3072, 1024])),
                                   str(hparams.get("activations", "Tanh")), hparams.get("final_activation"))

    def drop_unused_layers(self) -> int:
        """Removes the encoder layers above the highest one the embedding reads (sparsemax gives
        the top layers a weight of exactly 0 in some models, and 0 * h adds exactly nothing), so
        they are never run. Returns how many layers are left."""
        layers = self.encoder.model.encoder.layer
        if self.pool == "default" or self.xl:
            # "default" reads the last layer's output; XLM-R-XL normalizes its last layer's
            # output alone, so the top layer stays the top one.
            return len(layers)
        if self.layerwise_attention is not None:
            with torch.no_grad():
                top = int(self.layerwise_attention.weights().nonzero().max())
        else:
            top = int(self.layer) % (len(layers) + 1)
            self.layer = str(top)  # a layer counted from the end: from the start, as layers go
        del layers[top:]
        return len(layers)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.encoder.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        layers = out.hidden_states
        if self.layerwise_attention is not None:
            emb = self.layerwise_attention(layers, attention_mask)
        else:
            emb = layers[int(self.layer)]
        if self.pool == "avg":
            # Padding found by the pad id, the count by the attention mask, as COMET's average_pooling.
            pad = input_ids.eq(self.pad_token_id).unsqueeze(-1)
            summed = emb.float().masked_fill(pad, 0.0).type_as(emb).sum(1)
            return summed / attention_mask.unsqueeze(-1).expand(emb.size()).float().sum(1)
        if self.pool == "max":
            pad = input_ids.eq(self.pad_token_id).unsqueeze(-1)
            return emb.float().masked_fill(pad, float("-inf")).type_as(emb).max(dim=1)[0]
        if self.pool == "cls":
            return emb[:, 0, :]
        return out.last_hidden_state[:, 0, :]  # "default"

    def estimate(self, src: torch.Tensor, mt: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        features = torch.cat((mt, ref, mt * ref, torch.abs(mt - ref), mt * src, torch.abs(mt - src)), dim=1)
        # A batch's few rows through layers that may be narrow (a checkpoint's hidden_sizes): the
        # products MKL's strict mode leaves depending on its threads (numerics.one_mkl_thread).
        with one_mkl_thread():
            return self.estimator.ff(features).view(-1)
