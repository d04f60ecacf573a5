"""Text conditioning: Qwen3-VL hidden-state taps in the Qwen-Image template, fixed layout."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from krea2.dit.prompt_template import PREFIX, SUFFIX
from krea2.infra.errors import UserError

RELEASE_TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)  # hidden_states indices (0 = embeds)
# Any of these marks a folder that holds a tokenizer (fast or slow BPE files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def text_encoder_folder(path: str | Path) -> Path:
    """The Qwen3-VL model folder of `path`: `path` itself, or its `text_encoder/` (a diffusers
    pipeline or release folder). UserError when neither has a config.json."""
    path = Path(path)
    if (path / "text_encoder" / "config.json").exists():
        return path / "text_encoder"
    if not (path / "config.json").exists():
        raise UserError(f"text encoder folder {path} has no config.json (nor text_encoder/)")
    return path


def tokenizer_folder(model_folder: str | Path) -> Path:
    """Where the tokenizer of a text-encoder folder lives: the folder itself, else its
    sibling `tokenizer/` (the diffusers layout keeps it there). UserError when neither has
    tokenizer files: loading would give transformers' empty one-token tokenizer."""
    model_folder = Path(model_folder)
    for folder in (model_folder, model_folder.parent / "tokenizer"):
        if any((folder / name).exists() for name in TOKENIZER_FILES):
            return folder
    raise UserError(
        f"no tokenizer for the text encoder {model_folder}: neither it nor "
        f"{model_folder.parent / 'tokenizer'} has {' or '.join(TOKENIZER_FILES)}; copy the "
        "tokenizer files next to the model (e.g. from Qwen/Qwen3-VL-4B-Instruct)"
    )


class TextEncoder(nn.Module):
    """Frozen Qwen3-VL (text only) -> the DiT's text stack.

    encode(prompts) -> (states [B, T, taps, hidden], mask [B, T] bool). T = max_length
    (512 in the release): up to max_length - len(suffix) prompt tokens, then padding
    (mask False), then the assistant suffix (mask True); the system prefix is dropped after
    encoding. Positions passed to Qwen count valid tokens only (cumsum(mask) - 1).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        taps: tuple[int, ...] = RELEASE_TAPS,
        max_length: int = 512,
    ) -> None:
        super().__init__()
        n_hidden = model.config.text_config.num_hidden_layers + 1
        if any(not 0 <= i < n_hidden for i in taps):
            raise UserError(f"text taps {tuple(taps)} outside hidden_states[0..{n_hidden - 1}]")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.taps = tuple(taps)
        self.max_length = max_length
        self.prefix_len = len(tokenizer(PREFIX).input_ids)
        self.suffix_len = len(tokenizer(SUFFIX).input_ids)
        if len(tokenizer) < 2 or self.prefix_len == 0 or self.suffix_len == 0:
            # e.g. AutoTokenizer on a folder without tokenizer files: every prompt would
            # become padding and the images would not depend on it.
            raise UserError(
                f"the text encoder's tokenizer is empty ({len(tokenizer)} tokens, the prompt "
                "template encodes to nothing); load the model's own tokenizer files"
            )
        if max_length <= self.suffix_len:
            raise UserError(f"max_length={max_length} leaves no room for a prompt")

    @property
    def hidden_size(self) -> int:
        return self.model.config.text_config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        taps: tuple[int, ...] = RELEASE_TAPS,
        max_length: int = 512,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> TextEncoder:
        """Load Qwen3-VL (e.g. Qwen3-VL-4B-Instruct) and its tokenizer from a local folder.

        `path`: the model folder, or a diffusers pipeline/release folder holding
        `text_encoder/`; the tokenizer is read from the model folder or its sibling
        `tokenizer/` (see `tokenizer_folder`).
        """
        from transformers import AutoTokenizer, Qwen3VLModel

        path = text_encoder_folder(path)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(path))
        model = Qwen3VLModel.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, tokenizer, taps, max_length)

    @classmethod
    def tiny(
        cls,
        text_dim: int = 64,
        taps: int = 3,
        max_length: int = 32,
        seed: int = 0,
        vocab_size: int = 512,
        corpus: Sequence[str] = (),
    ) -> TextEncoder:
        """A random-weight Qwen3-VL with `taps + 1` decoder layers and the code-built tokenizer
        (trained on the prompt template plus ``corpus``: the caller's vocabulary).

        Taps are hidden_states[1..taps]. Matches the DiT's `toy` config (64, 3) by default.
        """
        from transformers import Qwen3VLConfig, Qwen3VLModel

        from krea2.dit.tokenizer import build_tokenizer  # imports transformers (seconds)

        tok = build_tokenizer(corpus, vocab_size)
        head_dim = 32 if text_dim % 32 == 0 else text_dim // 2
        q = head_dim // 2  # mRoPE sections over (t, h, w) must sum to head_dim / 2
        cfg = Qwen3VLConfig(
            text_config=dict(
                hidden_size=text_dim,
                num_hidden_layers=taps + 1,
                num_attention_heads=max(1, text_dim // head_dim),
                num_key_value_heads=1,
                head_dim=head_dim,
                intermediate_size=2 * text_dim,
                vocab_size=len(tok),
                max_position_embeddings=max(1024, 4 * max_length),
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "mrope_section": [q - 2 * (q // 3), q // 3, q // 3],
                    "mrope_interleaved": True,
                },
                pad_token_id=tok.pad_token_id,
            ),
            vision_config=dict(
                depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                out_hidden_size=text_dim, deepstack_visual_indexes=[],
            ),
        )  # fmt: skip
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = Qwen3VLModel(cfg)
        return cls(model, tok, tuple(range(1, taps + 1)), max_length)

    def fingerprint(self) -> str:
        """Identifies the encoder for caching: architecture, taps, layout and weight checksum."""
        h = hashlib.sha256()
        tc = self.model.config.text_config
        arch = (tc.hidden_size, tc.num_hidden_layers, tc.vocab_size, tc.num_attention_heads)
        h.update(repr((arch, self.taps, self.max_length, len(self.tokenizer))).encode())
        emb = self.model.get_input_embeddings().weight
        h.update(emb.detach().float().sum().cpu().numpy().tobytes())
        h.update(emb.detach().flatten()[:64].float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def tokenize(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """(input_ids, mask) [B, prefix_len + max_length]: [prefix | prompt | PAD | suffix]."""
        tok = self.tokenizer
        body = tok(
            [PREFIX + p for p in prompts],
            truncation=True,
            padding="max_length",
            max_length=self.max_length + self.prefix_len - self.suffix_len,
            return_tensors="pt",
        )
        suffix = tok([SUFFIX] * len(prompts), return_tensors="pt")
        ids = torch.cat([body.input_ids, suffix.input_ids], dim=1)
        mask = torch.cat([body.attention_mask, suffix.attention_mask], dim=1).bool()
        return ids, mask

    @torch.no_grad()
    def encode(self, prompts: str | list[str]) -> tuple[Tensor, Tensor]:
        """Prompts -> (states [B, max_length, taps, hidden] model dtype, mask [B, max_length])."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids, mask = self.tokenize(prompts)
        ids, mask = ids.to(self.device), mask.to(self.device)
        # Padding must not consume a position: the suffix sits right after the prompt.
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True
        )
        states = torch.stack([out.hidden_states[i] for i in self.taps], dim=2)
        return states[:, self.prefix_len :], mask[:, self.prefix_len :]


class EmbeddingCache:
    """Text-stack cache keyed by (encoder fingerprint, prompt); in memory, optionally on disk.

    Entries are stored per prompt, so batches that mix cached and new prompts encode only
    the new ones.
    """

    def __init__(self, encoder: TextEncoder, root: str | Path | None = None, max_items: int = 4096):
        self.encoder = encoder
        self.fp = encoder.fingerprint()
        self.root = Path(root) / self.fp if root is not None else None
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
        self.max_items = max_items
        self.mem: OrderedDict[str, tuple[Tensor, Tensor]] = OrderedDict()
        self.hits = self.misses = 0

    def _key(self, prompt: str) -> str:
        return hashlib.sha256(f"{self.fp}\0{prompt}".encode()).hexdigest()

    def _get(self, key: str) -> tuple[Tensor, Tensor] | None:
        if key in self.mem:
            self.mem.move_to_end(key)
            return self.mem[key]
        if self.root is not None and (f := self.root / f"{key}.safetensors").exists():
            from safetensors.torch import load_file

            d = load_file(f)
            return d["states"], d["mask"]
        return None

    def _put(self, key: str, value: tuple[Tensor, Tensor]) -> None:
        self.mem[key] = value
        if len(self.mem) > self.max_items:
            self.mem.popitem(last=False)
        if self.root is not None:
            from safetensors.torch import save_file

            tmp = self.root / f"{key}.tmp"
            save_file({"states": value[0].contiguous(), "mask": value[1]}, str(tmp))
            tmp.replace(self.root / f"{key}.safetensors")

    def encode(self, prompts: str | list[str]) -> tuple[Tensor, Tensor]:
        """Same contract as TextEncoder.encode; cached rows live on the CPU."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        keys = [self._key(p) for p in prompts]
        found = {k: v for k in dict.fromkeys(keys) if (v := self._get(k)) is not None}
        todo = [p for p, k in dict(zip(prompts, keys, strict=True)).items() if k not in found]
        self.hits += len(prompts) - sum(1 for k in keys if k not in found)
        self.misses += sum(1 for k in keys if k not in found)
        if todo:
            states, mask = self.encoder.encode(todo)
            for i, p in enumerate(todo):
                v = (states[i].cpu(), mask[i].cpu())
                found[self._key(p)] = v
                self._put(self._key(p), v)
        return (
            torch.stack([found[k][0] for k in keys]),
            torch.stack([found[k][1] for k in keys]),
        )
