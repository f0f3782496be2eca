"""What a decoder's results are is declared once, by its config model (`PRODUCES`), and asked by every consumer
instead of its type key: the pipeline's config check, Home Assistant, validate's and quantize's judge."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from conftest import base_config, write_config

from edged.config import load_config
from edged.core.errors import ConfigError
from edged.model.postprocess import CLASSES, DETECTIONS, POSTPROCESSORS, RAW, SEGMENTS, produces, producing

MODEL = Path(__file__).resolve().parent.parent / "edged" / "assets" / "digits.int8.onnx"


def test_every_built_in_decoder_says_what_it_produces() -> None:
    POSTPROCESSORS.load_builtins()
    said = {key: produces(POSTPROCESSORS.configs[key]) for key in POSTPROCESSORS.ordered_keys()}
    assert said == {"classify": CLASSES, "raw": RAW, "detect": DETECTIONS, "centernet": DETECTIONS,
                    "gfl": DETECTIONS, "text": DETECTIONS, "segment": SEGMENTS, "detr": DETECTIONS}  # fmt: skip
    assert producing(DETECTIONS) == ["centernet", "detect", "detr", "gfl", "text"]  # the package's modules, sorted


def test_a_plugin_that_predates_produces_is_read_by_its_old_flag_or_as_raw() -> None:
    class Old:
        DETECTIONS: ClassVar[bool] = True

    class Silent:
        pass

    class Wrong:
        PRODUCES: ClassVar[str] = "boxes"  # not a kind: not trusted

    assert (produces(Old), produces(Silent()), produces(Wrong)) == (DETECTIONS, RAW, RAW)


@pytest.mark.parametrize(("post", "refused"), [({"type": "classify"}, True), ({"type": "segment"}, True),
                                               ({"type": "detect", "format": "yolov8"}, False)])  # fmt: skip
def test_tracking_asks_what_the_decoder_produces(tmp_path: Path, post: dict[str, str], refused: bool) -> None:
    data = base_config(tmp_path, MODEL, "/dev/video9")
    data["pipelines"][0] |= {"postprocess": post, "tracking": {"enabled": True}}
    path = write_config(tmp_path / "edged.yaml", data)
    if not refused:
        assert load_config(path).pipelines[0].tracking.enabled
        return
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (
        "tracking work on detections: set a postprocess type that gives them (centernet, detect, detr, gfl, text)"
        in str(err.value)
    )
