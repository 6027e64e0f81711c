"""What a turn streams out: text deltas that hold only whole characters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.local.streaming import TextStream


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aé ü你好世界🙂👍🏽\nß€")), max_size=40))
def test_text_stream_emits_only_whole_characters(tokenizer, text):
    stream = TextStream(tokenizer)
    deltas = [stream.push(token) for token in tokenizer.encode(text)] + [stream.flush()]
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == text == stream.text
