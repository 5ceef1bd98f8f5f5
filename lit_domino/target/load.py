"""The target model: loading any Hugging Face causal LM, its MASK token, and its features.

The target is the large model whose output speculative decoding must not change.
Drafters read its hidden states ("features"): ``hidden_states[j + 1]`` is the output
of decoder layer ``j`` (``hidden_states[0]`` is the embedding output).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_domino.runtime import cache
from lit_domino.target import embedded as embedded_target
from lit_domino.runtime.command import UsageError

MASK_TOKEN = "<|MASK|>"
"""The MASK token added when a tokenizer has none (DFlash drafts block positions from it)."""

CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
"""Qwen3 chat templates are applied with thinking off, as in the papers' evaluation."""


class TargetError(UsageError):
    """A target that cannot be used: missing, corrupt, or without a usable MASK row."""


# --------------------------------------------------------------------------- layer rules


def dflash_layer_ids(num_layers: int, n: int) -> list[int]:
    """DFlash/Domino feature layers: ``[L//2]`` for n = 1, else ``round(1 + i*(L-4)/(n-1))``.

    Qwen3-8B (36 layers, n = 5) → ``[1, 9, 17, 25, 33]``. Targets with fewer than
    4 layers are clamped into range so the rule stays usable on tiny models.
    """
    if num_layers < 1 or n < 1:
        raise ValueError(f"need num_layers >= 1 and n >= 1, got num_layers={num_layers}, n={n}")
    if n == 1:
        return [num_layers // 2]
    ids = [int(round(1 + i * (num_layers - 4) / (n - 1))) for i in range(n)]
    return [min(max(j, 0), num_layers - 1) for j in ids]


EAGLE3_MIN_LAYERS = 3
"""EAGLE-3 reads three distinct decoder layers (low, middle, high): a shallower target cannot give them."""


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3 feature layers: three distinct decoder layers, low, middle and high.

    ``[1, L//2 - 1, L - 4]`` (the official rule) where those are distinct, i.e. ``L >= 7`` (Qwen3-8B, 36 layers →
    ``[1, 17, 32]``). Shallower targets would repeat a layer (6 layers gave ``[1, 2, 2]``, 4 gave ``[1, 1, 0]``):
    the fused features would hold one layer twice, so they take three consecutive layers instead, from layer 1
    (``[1, 2, 3]`` for 4-6 layers; ``[0, 1, 2]`` for 3). Fewer than 3 layers is a ``ValueError``.
    """
    if num_layers < EAGLE3_MIN_LAYERS:
        raise ValueError(f"EAGLE-3 reads {EAGLE3_MIN_LAYERS} distinct target decoder layers (low, middle, high); a "
                         f"target with {num_layers} decoder layer{'s' if num_layers != 1 else ''} has too few: "
                         "use a deeper target or a drafter that reads fewer layers (backbone, domino)")
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(ids)) == len(ids) and ids == sorted(ids):  # L >= 7
        return ids
    low = min(1, num_layers - EAGLE3_MIN_LAYERS)
    return [low, low + 1, low + 2]


def check_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    """Validate decoder-layer ids (0-based) against the target's depth."""
    layer_ids = [int(j) for j in layer_ids]
    if not layer_ids:
        raise ValueError("feature_layers is empty: name at least one target decoder layer (0-based)")
    bad = [j for j in layer_ids if not 0 <= j < num_layers]
    if bad:
        raise ValueError(
            f"feature layer ids {bad} are out of range for a target with {num_layers} decoder layers "
            f"(valid: 0..{num_layers - 1}); use dflash_layer_ids/eagle3_layer_ids to pick them"
        )
    return layer_ids


def select_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate ``hidden_states[j + 1]`` for ``j`` in ``layer_ids`` → ``[b, t, n*d]``."""
    return torch.cat([hidden_states[j + 1] for j in layer_ids], dim=-1)


# --------------------------------------------------------------------------- the Target


def tokenizer_hash(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary (ids and strings), to match drafters to targets."""
    if tokenizer is None:
        return "none"
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


@dataclass
class Target:
    """A frozen target LM with what drafters need from it.

    ``model`` is any Hugging Face causal LM in eval mode with gradients off;
    ``tokenizer`` may be None for unit tests on random models; ``name`` is the target's
    identity in cache keys (:func:`target_identity`: a hub id, a local directory's absolute
    path, or ``embedded:<recipe directory>``, which does not depend on where the cache lives).
    """

    model: nn.Module
    tokenizer: object | None
    mask_token_id: int
    name: str = "target"
    chat_template_kwargs: dict = field(default_factory=lambda: dict(CHAT_TEMPLATE_KWARGS))

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.embed.weight.shape[0]

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def max_positions(self) -> int:
        return self.model.config.max_position_embeddings

    @property
    def embed(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end generation (the generation config's, else the tokenizer's)."""
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    @functools.cached_property
    def _tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer)

    def fingerprint(self) -> dict:
        """What a drafter must match to be used with this target."""
        return {
            "hidden_size": int(self.hidden_size),
            "vocab_size": int(self.vocab_size),
            "num_layers": int(self.num_layers),
            "tokenizer_hash": self._tokenizer_hash,
            "mask_token_id": int(self.mask_token_id),
        }

    def features(self, hidden_states, layer_ids: list[int]) -> torch.Tensor:
        """Raw (unfused) features ``[b, t, n*d]`` of the given decoder layers."""
        return select_features(hidden_states, check_layer_ids(layer_ids, self.num_layers))

    def layer_ids(self, rule: str, n: int | None = None) -> list[int]:
        """Feature layers by rule: ``"dflash"`` (needs n), ``"eagle3"`` or ``"dspark"`` (DFlash's n, then ``L-1``)."""
        if rule == "dflash":
            return dflash_layer_ids(self.num_layers, n or 1)
        if rule == "eagle3":
            try:
                return eagle3_layer_ids(self.num_layers)
            except ValueError as err:
                raise TargetError(f"target {self.name!r}: {err}") from err
        if rule == "dspark":  # DSpark: the DFlash layers, then the last layer (the target's distribution)
            return dflash_layer_ids(self.num_layers, n or 1) + [self.num_layers - 1]
        raise ValueError(f"unknown feature-layer rule {rule!r}; choose 'dflash', 'eagle3' or 'dspark'")

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template (thinking off)."""
        if self.tokenizer is None:
            raise TargetError("this target has no tokenizer; pass token ids instead of chat messages")
        if getattr(self.tokenizer, "chat_template", None) is None:  # transformers' own error names no target
            raise TargetError(f"target {self.name!r} has no chat template (its tokenizer's chat_template is unset); "
                              "the suite renders every prompt with it (the training answers, the benchmarks): use a "
                              "chat or instruct model, or set tokenizer.chat_template and save it with the model")
        out = self.tokenizer.apply_chat_template(
            list(messages),
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            **self.chat_template_kwargs,
        )
        ids = out["input_ids"] if not isinstance(out, list) else out
        return [int(i) for i in ids]

    @torch.no_grad()
    def forward_features(self, input_ids: torch.Tensor, layer_ids: list[int], attention_mask=None) -> torch.Tensor:
        """Run the target on full sequences and return their raw features ``[b, t, n*d]``.

        Runs the decoder without the LM head (``model.base_model``: the ``[b, t, V]`` logits would be thrown
        away; at V = 151,936 they are ~37x a layer's hidden states); a model without a separate decoder keeps
        one position's logits (``logits_to_keep=1``)."""
        body = self.model.base_model
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        out = body(**kwargs) if body is not self.model else self.model(**kwargs, logits_to_keep=1)
        return self.features(out.hidden_states, layer_ids)


def resolve_mask_token(tokenizer, embedding_rows: int) -> int:
    """The MASK id: the tokenizer's own mask token, else ``<|MASK|>`` (added if missing).

    The id must have a row in the target's embedding table; the target is never
    resized (a new LM-head row could change the target's own output).
    """
    if tokenizer.mask_token is not None:
        mask_id = tokenizer.mask_token_id
    else:
        if MASK_TOKEN not in tokenizer.get_vocab():
            tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        else:
            tokenizer.mask_token = MASK_TOKEN
        mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask_id is None or not 0 <= mask_id < embedding_rows:
        raise TargetError(
            f"MASK token id {mask_id} has no row in the target's embedding table ({embedding_rows} rows). "
            "Drafters need a MASK embedding; use a target whose embedding is padded beyond the tokenizer "
            "(Qwen3's is) or a tokenizer that already defines a mask token inside the vocabulary."
        )
    return int(mask_id)


def _is_local(path_or_id: str) -> bool:
    p = Path(path_or_id).expanduser()
    return p.exists() or path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") > 1


OFFLINE_HINT = ('Offline, use the embedded default target: load_target("embedded:default") '
                "(a tiny Qwen3 trained here, no network needed).")
HUB_CHECK_SECONDS = 3.0
"""How long the one connectivity check before a hub download may take."""


def hub_offline() -> bool | None:
    """``HF_HUB_OFFLINE``: True (1/true/yes/on: hub ids load from the local cache only), False
    (0/false/no/off: online, no connectivity check), None (unset: checked once, :func:`hub_reachable`)."""
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


@functools.lru_cache(maxsize=8)
def hub_reachable(endpoint: str | None = None, timeout: float = HUB_CHECK_SECONDS) -> bool:
    """Whether the hub (``$HF_ENDPOINT``, else https://huggingface.co) answers one HTTP request
    within ``timeout`` seconds (proxies as configured in the environment; any HTTP status counts).

    Checked once per process and endpoint before a hub id is loaded, so that an offline
    machine fails in seconds instead of after a long series of download retries."""

    url = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/") + "/"
    result = []

    def probe():  # in a thread: name resolution has no timeout of its own
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
            result.append(True)
        except urllib.error.HTTPError:  # the server answered (an error status is still an answer)
            result.append(True)
        except Exception:  # noqa: BLE001 (no route, refused, DNS, TLS, timeout)
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


@functools.lru_cache(maxsize=4)
def _load_cached(path_or_id: str, dtype: torch.dtype, device: str, name: str) -> Target:
    local = _is_local(path_or_id)
    kwargs = {}
    if local:
        path = Path(path_or_id).expanduser()
        if not path.is_dir():
            raise TargetError(f"target directory {path} does not exist; build the embedded default with "
                              "`python experiments/ablation.py --preset smoke` or pass a hub id like Qwen/Qwen3-8B")
        if not (path / "config.json").is_file():
            raise TargetError(f"{path} is not a model directory (no config.json); expected a save_pretrained output")
        root, problems = cache.check_directory(path)  # a cache artifact (the embedded target): its recorded hashes
        if problems:
            raise TargetError(f"target directory {path} is corrupt: {'; '.join(problems)} (checked against the "
                              f"marker {root / '.complete'}); delete {root} and rerun to rebuild it")
        source = str(path)
    else:
        source = path_or_id
        offline = hub_offline()
        unreachable = offline is None and not hub_reachable()
        if offline or unreachable:
            kwargs["local_files_only"] = True  # the local Hugging Face cache only: no retries
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if local:  # a local directory: missing weights or tokenizer files, nothing to do with the network
            raise TargetError(f"could not load the target directory {source}: {first} (expected the output "
                              "of save_pretrained: config.json, weights, tokenizer files)") from err
        if kwargs:
            why = ("HF_HUB_OFFLINE is set" if offline else f"the hub is unreachable (no answer within "
                   f"{HUB_CHECK_SECONDS:g} s; HF_HUB_OFFLINE=0 skips this check)")
            raise TargetError(f"could not load target {path_or_id!r}: {why} and it is not in the local Hugging Face "
                              f"cache ({first}). {OFFLINE_HINT}") from None
        raise TargetError(f"could not load target {path_or_id!r} from the Hugging Face hub: {first}") from err
    except Exception as err:  # corrupt weights, wrong format, ...
        raise TargetError(f"target {path_or_id!r} is corrupt or unreadable: {type(err).__name__}: {err}") from err
    model.to(device).eval().requires_grad_(False)
    if local:
        _check_finite(model, Path(source))
    try:
        mask_id = resolve_mask_token(tokenizer, model.get_input_embeddings().weight.shape[0])
    except TargetError as err:  # which target: the error ends a training or a benchmark far from where it was named
        raise TargetError(f"target {path_or_id!r}: {err}") from None
    return Target(model=model, tokenizer=tokenizer, mask_token_id=mask_id, name=name)


def _check_finite(model: nn.Module, directory: Path) -> None:
    """Refuse a target whose weights hold NaN or inf, naming the tensor and the file it came from."""
    bad = cache.first_nonfinite(model.state_dict().items())
    if bad is None:
        return
    name, count = bad
    raise TargetError(f"target {_weights_file(directory, name)} holds non-finite weights: tensor {name!r} has "
                      f"{count} NaN/inf values (the file is corrupt, or the training that wrote it diverged)")


def _weights_file(directory: Path, tensor: str) -> Path:
    """The weights file of ``directory`` holding ``tensor`` (a sharded checkpoint's index names it)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        try:
            shard = json.loads((directory / index).read_text())["weight_map"].get(tensor)
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if shard:
            return directory / shard
    single = [directory / n for n in ("model.safetensors", "pytorch_model.bin") if (directory / n).is_file()]
    return single[0] if single else directory


EMBEDDED_PREFIX = "embedded:"
"""Target specs ``embedded:<preset>`` name the tiny targets of :mod:`lit_domino.target.recipe`."""


def embedded_target_dir(tail: str, **build_kwargs) -> Path:
    """The folder of ``embedded:<tail>``: the verified shipped build, else the recipe's build (built here
    if not cached; ``build_kwargs`` go to :func:`lit_domino.target.recipe.build_tiny_target`)."""
    cfg, from_recipe = embedded_target.parse_spec(tail)
    shipped = None if from_recipe else embedded_target.shipped_target(cfg)
    if shipped is not None:
        return shipped
    if hasattr(cfg, "build"):  # a shaped random target (lit_domino.target.rehearsal): no recipe to train
        return cfg.build(**build_kwargs)
    from lit_domino.target.recipe import build_tiny_target  # the recipe pulls in Lightning and the corpora

    return build_tiny_target(cfg, **build_kwargs)


def embedded_target_state(tail: str) -> str | None:
    """How ``embedded:<tail>`` loads: ``"shipped"`` (the package's copy), ``"cached"`` (its recipe's build, done
    before) or None (its recipe trains it now)."""
    cfg, from_recipe = embedded_target.parse_spec(tail)
    if not from_recipe and embedded_target.shipped_target(cfg) is not None:
        return "shipped"
    return "cached" if cache.is_complete(cache.artifact_dir("target", cfg, name=cfg.name), warn=False) else None


def target_identity(spec: str | Path) -> str:
    """What names a target's weights, for cache keys: the embedded target's cache directory
    (it encodes the hash of its recipe), a local directory's absolute path, or the hub id."""
    spec = str(spec)
    if spec.startswith(EMBEDDED_PREFIX):
        return EMBEDDED_PREFIX + embedded_target.identity(spec[len(EMBEDDED_PREFIX) :])
    return str(Path(spec).expanduser().resolve()) if _is_local(spec) else spec


def load_target(path_or_hub_id: str | Path, dtype: torch.dtype | str = torch.float32, device: str = "cpu") -> Target:
    """Load a causal LM + tokenizer from a local directory, a hub id or ``embedded:<preset>``.

    The model is frozen and in eval mode.
    Memoised per process: the DataModule and the LightningModule share one copy.
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if device == "auto":  # the GPU when there is one
        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = str(path_or_hub_id)
    # The target's name is its identity (cache keys of regenerated data and features use it):
    # for the embedded target that is its recipe hash, not where the cache lives, so a moved
    # cache is reused whole.
    name = target_identity(spec)
    if spec.startswith(EMBEDDED_PREFIX):  # "embedded:default": the shipped build, else the recipe's (cached)
        spec = str(embedded_target_dir(spec[len(EMBEDDED_PREFIX) :]))
    return _load_cached(spec, dtype, str(device), name)
