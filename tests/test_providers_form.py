"""An upload's form read and changed as bytes (`providers.contract.form`): the fields the gateway
routes by are read, the model's value is rewritten in place, and every other byte goes on as the
client sent it; a body whose framing is wrong is a 400 saying what is wrong."""

from __future__ import annotations

import httpx
import pytest

from providers.contract import form
from providers.contract.errors import InvalidRequest

AUDIO = b"RIFF\r\n--not-the-boundary\r\n\r\n" + bytes(range(256))  # CRLFs, dashes, every byte
TYPE = 'multipart/form-data; boundary="XX"'


def upload() -> tuple[bytes, str]:
    """A body as the OpenAI SDK's HTTP client writes it, and its content type."""
    request = httpx.Request("POST", "http://gateway/v1/audio/transcriptions",
                            data={"model": "whisper-1", "language": "en"},
                            files={"file": ("a.wav", AUDIO, "audio/wav")})
    return request.read(), request.headers["content-type"]


def test_the_fields_and_files_of_an_sdk_upload_are_read() -> None:
    body, content_type = upload()

    assert form.fields(body, content_type) == {"model": "whisper-1", "language": "en"}
    assert form.files(body, content_type) == {"file"}
    found = {part.name: body[part.start:part.end] for part in form.parts(body, content_type)}
    assert found["file"] == AUDIO


def test_only_the_model_s_value_changes_when_it_is_rewritten() -> None:
    body, content_type = upload()
    renamed = form.with_field(body, content_type, "model", "whisper-large-v3")

    assert renamed == body.replace(b"whisper-1", b"whisper-large-v3", 1)
    assert form.fields(renamed, content_type)["model"] == "whisper-large-v3"


def test_an_absent_field_is_added_before_the_closing_delimiter_not_in_the_epilogue() -> None:
    body = (b"preamble\r\n--XX\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\n"
            b"en\r\n--XX--\r\nan epilogue quoting --XX-- is ignored")
    added = form.with_field(body, TYPE, "model", "m")

    assert added.endswith(b"\r\n--XX--\r\nan epilogue quoting --XX-- is ignored")
    assert form.fields(added, TYPE) == {"language": "en", "model": "m"}


def test_a_form_with_no_part_is_empty() -> None:
    assert form.parts(b"--XX--\r\n", TYPE) == []


@pytest.mark.parametrize(("body", "content_type", "said"), [
    (b"{}", "application/json", "Request body must be multipart/form-data (an upload)"),
    (b"--XX--", "multipart/form-data", "multipart/form-data without a boundary"),
    (b"no delimiter at all", TYPE, "multipart body has no part"),
    (b"--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm", TYPE,
     "multipart body is malformed or ended before its last part"),
    (b"--XX\r\nContent-Type: text/plain\r\n\r\nm\r\n--XX--", TYPE,
     "multipart part without a Content-Disposition"),
    (b"--XX\r\nContent-Disposition: form-data\r\n\r\nm\r\n--XX--", TYPE,
     "multipart part without a field name"),
    (b"--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n\xff\r\n--XX--", TYPE,
     "Field 'model' is not UTF-8"),
])
def test_a_broken_form_is_a_400_saying_what_is_wrong(body: bytes, content_type: str,
                                                     said: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        form.fields(body, content_type)

    assert str(caught.value) == said


def test_a_body_of_more_parts_than_any_upload_has_is_refused() -> None:
    part = b"--XX\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n.\r\n"
    body = part * (form.MAX_PARTS + 1) + b"--XX--\r\n"

    with pytest.raises(InvalidRequest, match="more than"):
        form.parts(body, TYPE)
    assert len(form.parts(part * form.MAX_PARTS + b"--XX--\r\n", TYPE)) == form.MAX_PARTS


def test_a_value_longer_than_a_field_the_gateway_reads_is_not_read() -> None:
    long = b"--XX\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n" \
        + b"p" * (form.MAX_FIELD + 1) + b"\r\n--XX--\r\n"

    assert form.fields(long, TYPE) == {}
