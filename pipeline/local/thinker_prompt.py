"""A Thinker prefill's inputs, one turn's or several turns' left-padded together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.local.prompt import ThinkerInputs


@dataclass
class ThinkerPrompt:
    """A Thinker prefill's inputs: one turn's, or several turns' left-padded together."""

    input_ids: torch.Tensor  # [rows, T]
    attention_mask: torch.Tensor  # [rows, T], 0 over the padding
    position_ids: torch.Tensor  # [4, rows, T]: text positions, then the three multimodal-RoPE rows
    input_features: torch.Tensor | None  # [clips, 128, frames], every row's clips in row order
    feature_attention_mask: torch.Tensor | None  # [clips, frames]
    pads: list[int]
    pixel_values: torch.Tensor | None = None  # [patches, patch values], every row's images in row order
    image_grid_thw: torch.Tensor | None = None  # [images, 3]

    @classmethod
    def of(cls, thinker, inputs: ThinkerInputs) -> ThinkerPrompt:
        device = thinker.device
        input_ids = inputs.input_ids.to(device)
        attention_mask = inputs.attention_mask.to(device)
        model_kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        features = feature_mask = None
        if inputs.input_features is not None and inputs.feature_attention_mask is not None:
            feature_mask = inputs.feature_attention_mask.to(device)
            features = inputs.input_features.to(device)
            model_kwargs["feature_attention_mask"] = feature_mask
        pixel_values = image_grid_thw = None
        if inputs.pixel_values is not None and inputs.image_grid_thw is not None:
            pixel_values = inputs.pixel_values.to(device)
            image_grid_thw = inputs.image_grid_thw.to(device)
            model_kwargs["image_grid_thw"] = image_grid_thw
        # Each row's positions as alone (this also sets the model's rope_deltas, unused here:
        # decoding steps keep their own positions).
        position_ids = thinker._prepare_position_ids_for_generation(input_ids, model_kwargs)
        return cls(input_ids, attention_mask, position_ids, features, feature_mask, [0], pixel_values, image_grid_thw)

    @classmethod
    def padded(cls, rows: list[ThinkerPrompt]) -> ThinkerPrompt:
        if len(rows) == 1:
            return rows[0]
        length = max(row.input_ids.shape[1] for row in rows)
        pads = [length - row.input_ids.shape[1] for row in rows]
        # Padding ids are masked out; 0 is an ordinary text token (not a multimodal placeholder,
        # which would have to match an audio feature). Padding positions are 1, as generate() pads.
        input_ids = torch.cat([torch.nn.functional.pad(row.input_ids, (pad, 0)) for row, pad in zip(rows, pads)])
        attention_mask = torch.cat(
            [torch.nn.functional.pad(row.attention_mask, (pad, 0)) for row, pad in zip(rows, pads)]
        )
        position_ids = torch.cat(
            [torch.nn.functional.pad(row.position_ids, (pad, 0), value=1) for row, pad in zip(rows, pads)], dim=1
        )
        clips = [row for row in rows if row.input_features is not None and row.feature_attention_mask is not None]
        features = feature_mask = None
        if clips:
            frames = max(row.input_features.shape[-1] for row in clips)  # type: ignore[union-attr]
            features = torch.cat(
                [
                    torch.nn.functional.pad(row.input_features, (0, frames - row.input_features.shape[-1]))  # type: ignore[union-attr,arg-type]
                    for row in clips
                ]
            )
            feature_mask = torch.cat(
                [
                    torch.nn.functional.pad(row.feature_attention_mask, (0, frames - row.feature_attention_mask.shape[-1]))  # type: ignore[union-attr,arg-type]
                    for row in clips
                ]
            )
        # Image features fill the <|image_pad|> positions row by row, as the rows' patches are ordered.
        seen = [row for row in rows if row.pixel_values is not None and row.image_grid_thw is not None]
        pixel_values = torch.cat([row.pixel_values for row in seen]) if seen else None  # type: ignore[misc]
        image_grid_thw = torch.cat([row.image_grid_thw for row in seen]) if seen else None  # type: ignore[misc]
        return cls(input_ids, attention_mask, position_ids, features, feature_mask, pads, pixel_values, image_grid_thw)
