"""Code2Wav decoded chunk by chunk with carried state: the chunks equal one decode of all frames.

Every layer of transformers' ``Qwen3OmniMoeCode2Wav`` is causal, so a chunk of new frames needs
only state from the frames before it, never their recomputation:

==========================================  ======================================================
layer                                       state carried from one chunk to the next
==========================================  ======================================================
code embedding (mean of 16 codebooks)       none (per frame)
8 transformer layers, sliding window 72     keys and values of the last 71 frames, per layer; the
                                            frame count (rotary positions continue from it)
RMSNorm, MLP, layer scale, final norm       none (per frame)
upsampling transposed convs (kernel 2,      none: kernel equals stride, each input sample makes
stride 2)                                   its own two outputs
ConvNeXt blocks: causal depthwise conv k7   its last 6 input samples; LayerNorm, the two linear
                                            layers and GELU are per sample
decoder convs (k7; the residual units' k7   their last ``(kernel - 1) * dilation`` input samples
at dilation 1, 3, 9 and k1)                 (6, 18, 54 or 0)
decoder blocks' transposed convs (kernel    the last input sample: output block ``q`` (``stride``
2 r, stride r, trimmed by r on each side)   samples) needs inputs ``q`` and ``q + 1``
SnakeBeta activations, clamp                none (per sample)
==========================================  ======================================================

Zeros stand in for the history before the first frame, which is what the whole decode's left
padding holds. The one-sample lookahead of the four decoder transposed convolutions is why a
decode of ``F`` frames is ``1920 F - 555`` samples long (``555 = 480 + 60 + 12 + 3``): each chunk
yields the samples its frames make final and the next chunk continues exactly there, so the
chunks concatenate to the whole decode, sample for sample up to float rounding (the attention
sums over the cache in another order than over the whole sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.utils.generic import is_flash_attention_requested


class Code2WavLayoutError(ValueError):
    """A Code2Wav whose layers differ from what streaming was written for (see the module docstring)."""


@dataclass
class Code2WavState:
    """One turn's (or a batch of turns') Code2Wav state between chunks. Rows stack along dim 0."""

    frames: int = 0  # frames decoded so far
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [rows, heads, <= window - 1, head dim]
    values: list[torch.Tensor] = field(default_factory=list)
    histories: list[torch.Tensor] = field(default_factory=list)  # per convolution, in call order

    @property
    def started(self) -> bool:
        return self.frames > 0

    @property
    def cached(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def batch_key(self) -> tuple[int, int]:
        """States with the same key decode in one call: same cached length and histories' shapes."""
        return (self.cached, min(self.frames, 1))

    @staticmethod
    def stacked(states: list[Code2WavState]) -> Code2WavState:
        if len(states) == 1:
            return states[0]
        if len({state.batch_key() for state in states}) > 1:
            raise ValueError("Code2Wav states of different lengths cannot decode together")
        first = states[0]
        if not first.started:
            return Code2WavState()
        return Code2WavState(
            frames=min(state.frames for state in states),  # (decode() takes each row's positions from its own)
            keys=[torch.cat([state.keys[layer] for state in states]) for layer in range(len(first.keys))],
            values=[torch.cat([state.values[layer] for state in states]) for layer in range(len(first.values))],
            histories=[torch.cat([state.histories[index] for state in states]) for index in range(len(first.histories))],
        )

    def row(self, row: int, frames: int) -> Code2WavState:
        return Code2WavState(
            frames=frames,
            keys=[keys[row : row + 1] for keys in self.keys],
            values=[values[row : row + 1] for values in self.values],
            histories=[history[row : row + 1] for history in self.histories],
        )


class _WindowCache:
    """What a Code2Wav attention layer's ``cache.update`` sees: the carried keys and values
    before this chunk's, and keeps the last ``window - 1`` of them for the next chunk."""

    def __init__(self, state: Code2WavState, window: int) -> None:
        self._state = state
        self._keep = window - 1
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self._state.keys:
            key_states = torch.cat([self._state.keys[layer_idx], key_states], dim=2)
            value_states = torch.cat([self._state.values[layer_idx], value_states], dim=2)
        self.keys.append(key_states[:, :, -self._keep :])
        self.values.append(value_states[:, :, -self._keep :])
        return key_states, value_states


class StreamingCode2Wav:
    """Decodes codec frames chunk by chunk for any number of turns, each with its ``Code2WavState``.

    ``decode(codes, states)`` takes a chunk of new frames per row and returns the new final
    samples of each row; concatenated over a turn's chunks they equal ``code2wav(all frames)``.
    """

    def __init__(self, code2wav) -> None:
        self._model = code2wav
        config = code2wav.config
        self.samples_per_frame = int(code2wav.total_upsample)
        transformer = code2wav.pre_transformer
        self._layers = list(transformer.layers[: config.num_hidden_layers])
        self._norm = transformer.norm
        self._rotary = transformer.rotary_emb
        self._window = int(config.sliding_window)
        if any(kind != "sliding_attention" for kind in config.layer_types):
            raise Code2WavLayoutError(f"Code2Wav layers {config.layer_types} are not all sliding-window attention")
        self._attention = config._attn_implementation
        # Every convolution and transposed convolution, in call order, each checked for the
        # causal layout this class carries state for.
        self._convs = [
            module
            for module in code2wav.modules()
            if type(module).__name__ in ("Qwen3OmniMoeCausalConvNet", "Qwen3OmniMoeCausalTransConvNet")
        ]
        for module in self._convs:
            _check_layout(module)

    def new_state(self) -> Code2WavState:
        return Code2WavState()

    def decode_in_chunks(self, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """One turn's [1, quantizers, n] frames decoded in chunks of ``sizes`` (summing to n) and
        joined: what the engine's chunks add up to (tests and benchmarks hold it against one
        whole decode)."""
        states, pieces, start = [self.new_state()], [], 0
        for size in sizes:
            wave, states = self.decode(codes[..., start : start + size], states)
            pieces.append(wave[0])
            start += size
        return torch.cat(pieces)

    def decode(self, codes: torch.Tensor, states: list[Code2WavState]) -> tuple[torch.Tensor, list[Code2WavState]]:
        """[rows, quantizers, n] new frames and each row's state -> ([rows, samples] final new
        samples, each row's next state). All rows' states must share ``batch_key()``."""
        rows, _, steps = codes.shape
        if rows != len(states):
            raise ValueError(f"{rows} rows of codes for {len(states)} states")
        state = Code2WavState.stacked(states)
        model = self._model
        hidden = model.code_embedding(codes + model.code_offset).mean(1)
        positions = torch.stack([torch.arange(s.frames, s.frames + steps, device=codes.device) for s in states])
        cache = _WindowCache(state, self._window)
        mask = self._mask(state.cached, steps, hidden)
        position_embeddings = self._rotary(hidden, positions)
        for layer in self._layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings, cache=cache)
        hidden = self._norm(hidden).transpose(1, 2)
        histories = iter(state.histories)
        new_histories: list[torch.Tensor] = []
        stream = _ConvStream(histories, new_histories, first=not state.started)
        with _streaming_convs(self._convs, stream):
            for blocks in model.upsample:
                for block in blocks:
                    hidden = block(hidden)
            wave = hidden
            for block in model.decoder:
                wave = block(wave)
        wave = wave.clamp(min=-1, max=1)[:, 0]
        carried = Code2WavState(keys=cache.keys, values=cache.values, histories=new_histories)
        return wave, [carried.row(row, states[row].frames + steps) for row in range(rows)]

    def _mask(self, cached: int, steps: int, like: torch.Tensor) -> torch.Tensor | None:
        """Query ``i`` (frame ``cached + i`` of the keys) sees keys ``j`` with
        ``cached + i - window < j <= cached + i``: transformers' sliding-window causal mask.
        Flash attention builds it from its causal flag and window instead (bottom-right aligned)."""
        if is_flash_attention_requested(requested_attention_implementation=self._attention):
            return None
        queries = torch.arange(cached, cached + steps, device=like.device)[:, None]
        keys = torch.arange(cached + steps, device=like.device)[None, :]
        hidden = (keys > queries) | (keys <= queries - self._window)
        mask = torch.zeros(hidden.shape, dtype=like.dtype, device=like.device)
        return mask.masked_fill(hidden, torch.finfo(like.dtype).min)[None, None]


def _check_layout(module) -> None:
    name = type(module).__name__
    conv = module.conv
    if name == "Qwen3OmniMoeCausalConvNet":
        if conv.stride[0] != 1 or conv.padding[0] != 0 or module.padding != module.kernel_size - 1:
            raise Code2WavLayoutError(f"{name} with stride {conv.stride}: only stride-1 causal convolutions stream")
    else:
        kernel, stride = conv.kernel_size[0], conv.stride[0]
        trim = kernel - stride
        if kernel not in (stride, 2 * stride) or module.left_pad != trim or module.right_pad != trim:
            raise Code2WavLayoutError(f"{name} with kernel {kernel}, stride {stride}: not the layout streaming carries")


class _ConvStream:
    """Carries each convolution's input history through one chunk's forward, in call order."""

    def __init__(self, histories, new_histories: list[torch.Tensor], *, first: bool) -> None:
        self._histories = histories
        self._new = new_histories
        self._first = first

    def _history(self, span: int, hidden: torch.Tensor) -> torch.Tensor:
        if self._first:
            return hidden.new_zeros((*hidden.shape[:2], span))
        return next(self._histories)

    def causal_conv(self, module, hidden: torch.Tensor) -> torch.Tensor:
        span = module.kernel_size - 1
        extended = torch.cat([self._history(span, hidden), hidden], dim=-1)
        self._new.append(extended[..., extended.shape[-1] - span :])
        return module.conv(extended)

    def transposed_conv(self, module, hidden: torch.Tensor) -> torch.Tensor:
        conv = module.conv
        stride = conv.stride[0]
        if conv.kernel_size[0] == stride:  # each input sample makes its own outputs
            return conv(hidden)
        # kernel 2 * stride: output block q needs inputs q and q + 1. With the previous chunk's
        # last input first, this chunk's n inputs complete n blocks; the whole decode's first
        # block (its left trim) never exists.
        extended = torch.cat([self._history(1, hidden), hidden], dim=-1)
        self._new.append(extended[..., -1:])
        output = conv(extended)[..., stride : stride * extended.shape[-1]]
        return output[..., stride:] if self._first else output


class _streaming_convs:
    """For one chunk, the two convolution wrappers take their history from a ``_ConvStream``
    instead of zero padding; transformers' blocks around them (ConvNeXt, residual units,
    decoder blocks) run as they are. The wrappers' own forwards are back afterwards."""

    def __init__(self, convs, stream: _ConvStream) -> None:
        self._convs = convs
        self._stream = stream
        self._saved: list[tuple[object, object]] = []

    def __enter__(self) -> None:
        for module in self._convs:
            self._saved.append((module, module.__dict__.get("forward")))
            if type(module).__name__ == "Qwen3OmniMoeCausalConvNet":
                module.forward = lambda hidden, module=module: self._stream.causal_conv(module, hidden)
            else:
                module.forward = lambda hidden, module=module: self._stream.transposed_conv(module, hidden)

    def __exit__(self, *exc) -> None:
        for module, forward in self._saved:
            if forward is None:
                del module.forward  # type: ignore[attr-defined]
            else:
                module.forward = forward  # type: ignore[attr-defined]

