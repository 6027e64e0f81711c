
from pipeline.local.tokenizer import CHAT_TEMPLATE, REGULAR_VOCAB_SIZE, SPECIAL_TOKENS
from pipeline.token_count import qwen_encoding, text_tokens

MIXED_TEXT = (
    "Hello world! It's 2026-11-29, and we'll test 12345 numbers.\n\n"
    "  Indented   spaces\tand tabs\r\n"
    "Ünïcödé, 你好，世界！ こんにちは 🙂 Привет, мир.\n"
    "def f(x):\n    return x ** 2  # comment\n"
    "I'M SHOUTING; they've gone... 'quoted' \"double\" {braces} [brackets] <tags>"
)


def test_hello_world_has_the_real_qwen_ids(tokenizer):
    assert tokenizer.encode("Hello world") == [9707, 1879]


def test_role_words_have_the_real_qwen_ids(tokenizer):
    assert [tokenizer.encode(word) for word in ("system", "user", "assistant")] == [[8948], [872], [77091]]


def test_special_tokens_sit_at_their_real_ids(tokenizer):
    assert tokenizer.encode("<|im_start|>") == [151644]
    assert tokenizer.encode("<|audio_pad|>") == [151675]
    assert {token_id: tokenizer.convert_ids_to_tokens(token_id) for token_id in SPECIAL_TOKENS} == {
        token_id: content for token_id, (content, _) in SPECIAL_TOKENS.items()
    }
    assert len(tokenizer) == 151676


def test_chatml_prompt_encodes_to_the_real_ids(tokenizer):
    prompt = "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode(prompt) == [151644, 872, 198, 151669, 151675, 151670, 151645, 198, 151644, 77091, 198]


def test_encoding_matches_tiktoken_on_the_same_ranks(tokenizer):
    # What the session and the vLLM-Omni client count with (pipeline/token_count.py).
    reference = qwen_encoding()
    assert reference.n_vocab == REGULAR_VOCAB_SIZE
    assert tokenizer.encode(MIXED_TEXT) == reference.encode(MIXED_TEXT)
    assert text_tokens(MIXED_TEXT) == len(tokenizer.encode(MIXED_TEXT))


def test_decode_round_trips_text_and_special_tokens(tokenizer):
    text = MIXED_TEXT + "<|im_end|>"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == MIXED_TEXT


def test_eos_and_pad_are_qwens(tokenizer):
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (151645, 151643)


def test_chat_template_renders_chatml_with_audio_placeholders(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and this"}]},
        {"role": "assistant", "content": "Sure."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>and this<|im_end|>\n"
        "<|im_start|>assistant\nSure.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_multimodal_tokens_are_named_as_qwens_processor_reads_them(tokenizer):
    """Qwen3OmniMoeProcessor takes each placeholder's token from the tokenizer by name."""
    assert (tokenizer.audio_bos_token_id, tokenizer.audio_token_id, tokenizer.audio_eos_token_id) == (151669, 151675, 151670)
    assert (tokenizer.vision_bos_token_id, tokenizer.image_token_id, tokenizer.video_token_id,
            tokenizer.vision_eos_token_id) == (151652, 151655, 151656, 151653)
