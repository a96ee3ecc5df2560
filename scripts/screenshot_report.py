"""Render a sweep's report.html to a PNG (docs/sweep-report.png), for the README.

No browser is at hand here, so the page is laid out by WeasyPrint (HTML and CSS to PDF, on
one tall page) and rasterised by PDFium (pypdfium2): `make sweep-screenshot` installs both
into a venv of their own (.venv-shot); neither is a dependency of rollout.

usage: python scripts/screenshot_report.py REPORT.html OUT.png
"""

from __future__ import annotations

import sys


def main() -> None:
    import pypdfium2 as pdfium
    import weasyprint

    src, out = sys.argv[1], sys.argv[2]
    page = weasyprint.CSS(
        string="@page { size: 1120px 2200px; margin: 12px } body { margin: 12px }"
    )
    pdf_bytes = weasyprint.HTML(filename=src).write_pdf(stylesheets=[page])
    pdf = pdfium.PdfDocument(pdf_bytes)
    image = pdf[0].render(scale=1.0).to_pil()
    # crop the empty bottom of the tall page
    import numpy as np

    ink = np.flatnonzero((np.asarray(image.convert("L")) < 250).any(axis=1))
    bottom = int(ink[-1]) + 20 if len(ink) else image.height
    image.crop((0, 0, image.width, min(image.height, bottom))).save(out, optimize=True)
    print(f"wrote {out} ({image.width} px wide)")


if __name__ == "__main__":
    main()
