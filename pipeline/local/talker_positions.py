"""The Talker prompt's positions: Qwen's multimodal-RoPE rule, as its own release applies it."""

from __future__ import annotations

import torch

from pipeline.local.prompt import ThinkerInputs


def talker_prompt_positions(thinker, talker_ids: torch.Tensor, inputs: ThinkerInputs) -> torch.Tensor:
    """[1, T] Talker ids of one turn's prompt -> its positions [4, 1, T]: the text positions, then
    the three multimodal-RoPE rows (time, height, width).

    Qwen's rule (transformers 4.57.1, Qwen's release of Qwen3-Omni: the Talker's ``get_rope_index``
    is the Thinker's): the Thinker's ``get_rope_index`` on the Talker's ids (the user segments'
    ids, then ``<tts_pad>`` over the assistant preamble), with every image's grid and every
    clip's feature length in ``inputs``. Images lie on their 3-D grid and what follows one goes
    on from its largest position + 1; text and audio go one after another. The Thinker's
    config is the one that holds the audio encoder's window, which the rule's audio lengths need.
    """
    attention_mask = torch.ones_like(talker_ids)
    image_grid_thw = None if inputs.image_grid_thw is None else inputs.image_grid_thw.to(talker_ids.device)
    audio_lengths = None
    if inputs.feature_attention_mask is not None:
        audio_lengths = inputs.feature_attention_mask.to(talker_ids.device).sum(dim=1)
    rope_positions, _ = thinker.get_rope_index(
        talker_ids,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
        use_audio_in_video=False,
        audio_seqlens=audio_lengths,
    )
    text_positions = torch.arange(talker_ids.shape[1], device=talker_ids.device).view(1, 1, -1)
    return torch.cat([text_positions.to(rope_positions.dtype), rope_positions.to(talker_ids.device)])
