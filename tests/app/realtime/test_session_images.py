"""Images in a session: ``input_image`` parts, camera frames joining spoken turns, image history.

A scripted engine answers and records each turn's conversation; an energy VAD hears a tone as
speech. Camera frames are handed to the session as the call's sampler would.
"""

from __future__ import annotations

import base64
import json

import pytest
import pytest_asyncio

from app.realtime.input import TurnFrames, read_item_images
from app.realtime.protocol import ClientContentPart, ProtocolError
from app.realtime.session_config import DETAIL_MAX_PIXELS, SessionConfig, VideoInput
from app.token_bucket import TokenBucket
from media.frames import SampledFrame
from pipeline.conversation import IMAGE_NOTE, HistoryLimits, UserAudio, UserImage, UserText
from pipeline.images import probe
from tests.clock import FakeClock
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.hostile import flat_png
from tests.pictures import data_url, encoded
from tests.settle import settle
from tests.speech import silence, tone


class Harness(SessionHarness):
    def __init__(self, config: SessionConfig | None = None) -> None:
        super().__init__(ScriptedEngine("I see it"), EnergyVad(), config)

    def utter(self, speech_ms: int = 600) -> None:
        self.push(tone(speech_ms))
        self.push(silence(700))

    def show(self, seed: int, width: int = 512, height: int = 384) -> None:
        self.session.add_video_frame(SampledFrame(encoded(width, height, seed=seed), width, height))

    async def create_item(self, *content: dict, event_id: str = "e1") -> None:
        item = {"type": "message", "role": "user", "content": list(content)}
        await self.send(type="conversation.item.create", item=item, event_id=event_id)

    def last_error(self) -> dict:
        return self.last("error")["error"]


@pytest_asyncio.fixture(loop_scope="function")
async def h():
    async with Harness() as harness:
        yield harness


def _image(seed: int) -> dict:
    return {"type": "input_image", "image_url": data_url(encoded(640, 480, seed=seed))}


# -- input_image -------------------------------------------------------------------------------


async def test_an_input_image_and_text_reach_the_prompt_in_order(h):
    await h.create_item({**_image(1), "detail": "low"}, {"type": "input_text", "text": "What is this?"})
    await h.send(type="response.create")
    done = await h.turn_done()

    items = h.engine.requests[0].conversation.items
    assert [type(item) for item in items] == [UserImage, UserText]
    image = items[0]
    assert (image.width, image.height, image.max_pixels) == (352, 256, DETAIL_MAX_PIXELS["low"])
    assert probe(image.data).format == "JPEG"  # fitted to the budget once, here
    assert done["response"]["usage"]["input_token_details"]["image_tokens"] == image.tokens == 88
    echoed = h.of_type("conversation.item.done")[0]["item"]["content"]
    assert echoed[0] == {"type": "input_image", "image_url": None, "detail": "low"}


async def test_an_image_within_the_budget_is_kept_as_sent(h):
    png = encoded(320, 240, format="PNG", seed=2)
    await h.create_item({"type": "input_image", "image_url": data_url(png, "image/png")})
    await h.send(type="response.create")
    await h.turn_done()
    image = h.engine.requests[0].conversation.items[0]
    assert (image.data, image.max_pixels) == (png, DETAIL_MAX_PIXELS["auto"])


async def test_a_non_image_data_url_gets_an_error_and_the_session_goes_on(h):
    await h.create_item({"type": "input_image", "image_url": "data:text/plain;base64,aGVsbG8="}, event_id="bad")
    error = h.last_error()
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "item.content[0].image_url", "bad")
    assert not h.of_type("conversation.item.added")
    await h.create_item(_image(3))
    assert len(h.of_type("conversation.item.added")) == 1


async def test_bytes_that_are_no_image_under_an_image_type_get_an_error(h):
    await h.create_item({"type": "input_image", "image_url": data_url(b"\x89PNG not really", "image/png")})
    assert h.last_error()["code"] == "invalid_value"
    assert "not a PNG or JPEG image" in h.last_error()["message"]


async def test_an_image_url_to_fetch_gets_an_error(h):
    await h.create_item({"type": "input_image", "image_url": "https://example.com/cat.jpg"})
    assert "fetches no URLs" in h.last_error()["message"]


async def test_an_image_over_the_byte_limit_gets_image_too_large():
    h = Harness(SessionConfig(max_image_bytes=10_000))
    await h.session.start()
    await h.create_item({"type": "input_image", "image_url": data_url(bytes(20_000))})
    assert h.last_error()["code"] == "image_too_large"
    await h.session.close()


async def test_an_event_over_the_image_event_limit_gets_event_too_large_before_it_is_read():
    h = Harness(SessionConfig(max_event_bytes=4_096, max_image_bytes=10_000))
    await h.session.start()
    await h.create_item({"type": "input_image", "image_url": data_url(bytes(20_000))})
    assert h.last_error()["code"] == "event_too_large"
    assert "besides the input_image data URLs of a conversation.item.create (at most 17432 in all)" in (
        h.last_error()["message"]
    )
    await h.session.close()


async def test_a_large_event_without_an_image_is_refused_once_parsed():
    h = Harness(SessionConfig(max_event_bytes=4_096, max_image_bytes=100_000))
    await h.session.start()
    await h.create_item({"type": "input_text", "text": "x" * 8_000})
    assert h.last_error()["code"] == "event_too_large"
    image = data_url(encoded(400, 300, format="PNG", seed=5), "image/png")
    assert len(json.dumps(image)) > 4_096  # an image event over max_event_bytes is taken
    await h.create_item({"type": "input_image", "image_url": image})
    assert len(h.of_type("conversation.item.added")) == 1
    await h.session.close()


async def test_the_image_exemption_covers_the_image_bytes_only(h):
    # Only image bytes are exempt from the event size: 14 MB of µ-law beside one tiny image would be
    # 22 minutes of audio decoded and resampled on the loop.
    await h.send(type="session.update", session={"input_audio_format": "g711_ulaw"})
    tiny = {"type": "input_image", "image_url": data_url(encoded(32, 32))}
    audio = {"type": "input_audio", "audio": base64.b64encode(bytes(10_500_000)).decode()}
    await h.create_item(tiny, audio, event_id="big")
    error = h.last_error()
    assert (error["code"], error["event_id"]) == ("event_too_large", "big")
    assert not h.of_type("conversation.item.added")
    await h.create_item(tiny, {"type": "input_text", "text": "x" * 300_000})  # text beside it: the same
    assert h.last_error()["code"] == "event_too_large"
    await h.create_item(tiny, {"type": "input_audio", "audio": base64.b64encode(bytes(8_000)).decode()})
    assert len(h.of_type("conversation.item.added")) == 1  # an ordinary event beside the image is taken


async def test_a_50_mp_rgba_png_is_refused_from_its_header_and_the_session_goes_on(h):
    # 194 KB that would decode to 200 MB (+415 MB at its peak, 2.7 s): refused from its header.
    await h.create_item({"type": "input_image", "image_url": data_url(flat_png(7071, 7071), "image/png")})
    error = h.last_error()
    assert (error["code"], error["param"]) == ("invalid_value", "item.content[0].image_url")
    assert "decoding it takes more than 96 MiB" in error["message"]
    await h.create_item(_image(1), {"type": "input_text", "text": "And this?"})
    assert len(h.of_type("conversation.item.added")) == 1


async def test_a_sessions_image_decoding_is_held_to_its_rate_before_anything_is_decoded():
    clock = FakeClock()
    budget = TokenBucket(40 * 2**20, 10 * 2**20, clock=clock)
    png = data_url(flat_png(1600, 1200), "image/png")  # 15 MiB to decode: RGBA and its RGB copy
    content = [ClientContentPart(type="input_image", image_url=png)]
    assert len(await read_item_images(content * 2, max_bytes=2**20, budget=budget)) == 2
    with pytest.raises(ProtocolError) as refused:
        await read_item_images(content * 2, max_bytes=2**20, budget=budget)  # 30 MiB, 10 left
    assert (refused.value.code, refused.value.param) == ("rate_limit_exceeded", "item.content")
    clock.now += 2.0  # 20 MiB more
    assert len(await read_item_images(content * 2, max_bytes=2**20, budget=budget)) == 2


async def test_a_message_takes_at_most_eight_images(h):
    small = {"type": "input_image", "image_url": data_url(encoded(32, 32))}
    await h.create_item(*[small] * 9)
    assert (h.last_error()["code"], h.last_error()["param"]) == ("invalid_value", "item.content")


# -- camera frames -----------------------------------------------------------------------------


async def test_a_spoken_turn_takes_the_frame_before_it_and_the_last_frames_during_it(h):
    for seed in range(3):  # idle: only the newest counts as "before"
        h.show(seed)
    h.push(tone(400))  # speech confirmed: speech_started
    assert h.of_type("input_audio_buffer.speech_started")
    for seed in range(10, 16):  # six while speaking; four are kept
        h.show(seed)
    h.push(tone(200))
    h.push(silence(700))
    await h.turn_done()

    items = h.engine.requests[0].conversation.items
    assert [type(item) for item in items] == [UserImage] * 5 + [UserAudio]
    shown = [item.data for item in items[:5]]
    assert shown == [encoded(512, 384, seed=seed) for seed in (2, 12, 13, 14, 15)]
    content = h.of_type("conversation.item.done")[0]["item"]["content"]
    assert [part["type"] for part in content] == ["input_image"] * 5 + ["input_audio"]
    usage = h.last("response.done")["response"]["usage"]["input_token_details"]
    assert usage["image_tokens"] == 5 * 88


async def test_frames_never_start_a_turn_by_themselves(h):
    for seed in range(5):
        h.show(seed)
    h.push(silence(3_000))
    await settle()  # a turn started by mistake would have reached the engine by now
    assert h.engine.requests == [] and "response.created" not in h.types()
    assert h.session.stats()["camera_frames"] == 5  # frames_per_turn + 1 kept while idle


async def test_the_camera_is_sampled_faster_while_the_user_speaks(h):
    idle = h.session.video_plan()
    h.push(tone(400))
    speaking = h.session.video_plan()
    h.push(silence(700))
    await h.turn_done()
    assert (idle.interval_s, speaking.interval_s) == (4.0, 1.0)
    assert speaking.size(1280, 720) == (416, 224)  # within the default budget, multiples of 32
    assert h.session.video_plan().interval_s == 4.0


async def test_session_update_sets_the_camera_and_session_updated_shows_it(h):
    assert h.events[0]["session"]["video"] == {
        "speaking_fps": 1.0, "idle_fps": 0.25, "frames_per_turn": 4, "max_pixels": 100_352,
    }
    await h.send(type="session.update", session={"video": {"speaking_fps": 2, "frames_per_turn": 0}})
    assert h.last("session.updated")["session"]["video"]["speaking_fps"] == 2.0
    assert h.session.video_plan() is None  # frames_per_turn 0: nothing is sampled
    await h.send(type="session.update", session={"video": {"max_pixels": 10}}, event_id="e2")
    assert (h.last_error()["param"], h.last_error()["event_id"]) == ("session.video.max_pixels", "e2")


async def test_a_manual_commit_takes_the_newest_frames():
    h = Harness(SessionConfig(turn_detection=None, video=VideoInput(frames_per_turn=2)))
    await h.session.start()
    for seed in range(5):
        h.show(seed)
    h.push(tone(600))
    await h.send(type="input_audio_buffer.commit")
    await h.send(type="response.create")
    await h.turn_done()
    images = [item.data for item in h.engine.requests[0].conversation.items if isinstance(item, UserImage)]
    assert images == [encoded(512, 384, seed=seed) for seed in (2, 3, 4)]
    await h.session.close()


def test_turn_frames_stay_bounded_and_a_segment_takes_only_its_own():
    frames = TurnFrames()
    image = [UserImage(bytes([seed]), 64, 48, 200_704) for seed in range(20)]
    frames.add(image[0], 2)
    frames.speech_started()
    for seed in range(1, 6):
        frames.add(image[seed], 2)
    assert len(frames) == 3  # the one before, the last two during
    assert frames.take(2) == (image[0], image[4], image[5])
    frames.add(image[6], 2)
    assert frames.take(2) == (image[6],)  # the next segment of the same utterance
    frames.speech_ended()
    assert frames.take(2) == ()


# -- history -----------------------------------------------------------------------------------


async def test_older_turns_lose_their_images_first_keeping_a_note():
    # 88 tokens per frame, two per turn: 200 tokens of past images hold the newest turn's two.
    config = SessionConfig(history=HistoryLimits(max_image_tokens=200), video=VideoInput(frames_per_turn=1))
    h = Harness(config)
    await h.session.start()
    for turn in range(3):
        h.show(2 * turn)
        h.push(tone(400))
        h.show(2 * turn + 1)
        h.push(tone(200))
        h.push(silence(700))
        await h.turn_done(turn + 1)
        h.push(silence(500))  # the echo tail ends
    assert h.session.stats()["images"] == 2  # the last turn's
    h.utter()
    await h.turn_done(4)
    items = h.engine.requests[-1].conversation.items
    kinds = [IMAGE_NOTE if item == UserText(IMAGE_NOTE) else type(item).__name__ for item in items]
    # Each older turn's frames are notes now (the prompt writes a run of them once), its audio stays.
    assert kinds[:8] == [IMAGE_NOTE, IMAGE_NOTE, "UserAudio", "AssistantText"] * 2
    assert kinds[8:] == ["UserImage", "UserImage", "UserAudio", "AssistantText", "UserAudio"]
    await h.session.close()
